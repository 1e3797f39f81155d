package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/backoff"
)

// registryRetryFirst and registryRetryMax bound the waits between
// attempts while the schema registry is unavailable.
const (
	registryRetryFirst = 500 * time.Millisecond
	registryRetryMax   = 15 * time.Second
)

// registryHealth is what the ingester knows of the schema registry: while
// it is unavailable, the partitions whose records wait for a schema are
// rewound to the first of them and paused until the next attempt is due.
// Its own mutex guards it: decoding, which reads it, runs without mu.
type registryHealth struct {
	mu        sync.Mutex
	retry     backoff.Backoff
	retryAt   time.Time // while down: when to try again
	downSince time.Time // zero while the registry answers
	lastErr   error
}

// wait reports whether the next attempt is not due yet.
func (h *registryHealth) wait() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.downSince.IsZero() && time.Now().Before(h.retryAt)
}

// failed records an attempt that the registry could not answer, and
// returns the wait before the next.
func (h *registryHealth) failed(err error) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.downSince.IsZero() {
		h.downSince = time.Now()
	}
	d := h.retry.Next()
	h.retryAt, h.lastErr = time.Now().Add(d), err
	return d
}

// up records that the registry answered; it returns how long it was
// unavailable before, zero if it was not.
func (h *registryHealth) up() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.downSince.IsZero() {
		return 0
	}
	down := time.Since(h.downSince)
	h.downSince, h.lastErr, h.retryAt = time.Time{}, nil, time.Time{}
	h.retry.Reset()
	return down
}

// resumeAt is when paused partitions are to be fetched again.
func (h *registryHealth) resumeAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.retryAt
}

// err says since when the registry is unavailable and why, nil while it
// answers.
func (h *registryHealth) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.downSince.IsZero() {
		return nil
	}
	return &registryDownError{since: h.downSince, err: h.lastErr}
}

// registryDownError says since when the registry is unavailable; it wraps
// the last failure (an ErrRegistryUnavailable).
type registryDownError struct {
	since time.Time
	err   error
}

func (e *registryDownError) Error() string {
	why := strings.TrimPrefix(e.err.Error(), decode.ErrRegistryUnavailable.Error()+": ")
	state := "unreachable"
	if errors.Is(e.err, decode.ErrRegistryCredentials) {
		state = "refusing the credentials"
	}
	return fmt.Sprintf("schema registry %s since %s: %s", state, e.since.UTC().Format(time.RFC3339), why)
}

func (e *registryDownError) Unwrap() error { return e.err }

// newRegistry returns the schema registry client when a source of c
// needs one (a Debezium source reads the AvroConverter's records through
// it when it is configured), nil otherwise.
func newRegistry(c *Config) (*decode.Registry, error) {
	if !c.usesRegistry() {
		return nil, nil
	}
	return decode.NewRegistry(*c.SchemaRegistry)
}

// UsesRegistry reports whether a source of the ingester reads the schema
// registry.
func (in *Ingester) UsesRegistry() bool { return in.reg != nil }

// RegistryError says since when the schema registry is unreachable and
// why, while it is; nil while it answers or no source needs it.
func (in *Ingester) RegistryError() error {
	if in.reg == nil {
		return nil
	}
	return in.health.err()
}

// resolve gets the schemas of a partition's records, asking the registry
// nothing after until. It returns them and the index of the first record
// whose schema is missing (len(recs) when none is), and whether that
// record waits for the registry (its partition is then paused until the
// next attempt is due) rather than for time or ctx, which ended. Once an attempt fails, the other
// partitions take only what the cache holds until the next attempt is
// due.
func (in *Ingester) resolve(ctx context.Context, src *source, tp topicPartition, recs []*kgo.Record, until time.Time) (decode.Schemas, int, bool) {
	rctx := ctx
	waiting := in.health.wait()
	if waiting {
		c, cancel := context.WithCancel(ctx)
		cancel() // the cache only
		rctx = c
	}
	before := in.reg.Answered()
	s, err := src.dec.ResolveUntil(rctx, recs, until)
	if in.reg.Answered() > before {
		if down := in.health.up(); down > 0 {
			in.log.Info("schema registry reachable again", "unreachable_for", down.Round(time.Millisecond))
		}
	}
	in.m.registryCache.Set(float64(in.reg.Len()))
	if err == nil {
		return s, len(recs), false
	}
	first := len(recs)
	for i, r := range recs {
		if !src.dec.Resolved(s, r) {
			first = i
			break
		}
	}
	switch {
	case ctx.Err() != nil || errors.Is(err, decode.ErrResolveTime):
		return s, first, false // read again at the next poll
	case waiting:
		return s, first, true
	}
	in.m.registryErrors.WithLabelValues(src.name).Inc()
	wait := in.health.failed(err)
	in.rlog.emit(slog.LevelWarn, "unavailable", "schema registry unavailable; the records waiting for a schema are read again after a backoff",
		"source", src.name, "topic", tp.Topic, "partition", tp.Partition, "offset", recs[first].Offset, "retry_in", wait.Round(time.Millisecond), "err", err)
	return s, first, true
}

// rewindLocked moves the partitions whose records wait (for a schema, or
// for their stalled source) back to the first of them, and pauses those
// that wait for the registry or their source until the next attempt is
// due. Their later records in this fetch were not added: the batch never
// holds, nor commits, a position past a record not yet decoded.
func (in *Ingester) rewindLocked(waiting map[topicPartition]pendingPart) {
	if len(waiting) == 0 {
		return
	}
	seek := map[string]map[int32]kgo.EpochOffset{}
	pause := map[string][]int32{}
	for tp, p := range waiting {
		if seek[tp.Topic] == nil {
			seek[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		seek[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: p.offset}
		if p.pause != notPaused && in.paused[tp] == notPaused {
			in.paused[tp] = p.pause
			pause[tp.Topic] = append(pause[tp.Topic], tp.Partition)
		}
	}
	in.cl.SetOffsets(seek)
	if len(pause) > 0 {
		in.cl.PauseFetchPartitions(pause)
	}
}

// resumeDueLocked fetches the paused partitions again whose next attempt
// is due: at the registry, or at their stalled source.
func (in *Ingester) resumeDueLocked() {
	if len(in.paused) == 0 {
		return
	}
	registryDue := !time.Now().Before(in.health.resumeAt())
	due := map[topicPartition]bool{}
	for tp, why := range in.paused {
		switch why {
		case pausedRegistry:
			due[tp] = registryDue
		case pausedStalled:
			due[tp] = !in.stalls.waiting(in.byTopic[tp.Topic])
		}
	}
	in.resumeLocked(due)
}

// resumeLocked fetches the partitions in tps whose value is true again, if
// paused.
func (in *Ingester) resumeLocked(tps map[topicPartition]bool) {
	resume := map[string][]int32{}
	for tp, ok := range tps {
		if ok && in.paused[tp] != notPaused {
			resume[tp.Topic] = append(resume[tp.Topic], tp.Partition)
			delete(in.paused, tp)
		}
	}
	if len(resume) > 0 {
		in.cl.ResumeFetchPartitions(resume)
	}
}

// pollDeadline is when a poll must return: the batch's age limit, the
// next attempt at the registry or at a stalled source while partitions are
// paused for it, or, when sources may be paused, pollPauseCheck from now.
func (in *Ingester) pollDeadline() (time.Time, bool) {
	deadline, ok := in.batchDeadline()
	in.mu.Lock()
	defer in.mu.Unlock()
	for tp, why := range in.paused {
		var at time.Time
		switch why {
		case pausedRegistry:
			at = in.health.resumeAt()
		case pausedStalled:
			at = in.stalls.retryAt(in.byTopic[tp.Topic])
		}
		if !ok || at.Before(deadline) {
			deadline, ok = at, true
		}
	}
	if at := time.Now().Add(pollPauseCheck); in.isPaused != nil && (!ok || at.Before(deadline)) {
		deadline, ok = at, true
	}
	return deadline, ok
}

// pendingPart is where a partition's records wait: for their schema, or
// for their stalled source.
type pendingPart struct {
	offset int64     // the first record not decoded, or not to be added
	pause  pauseKind // what it waits for; notPaused: a write that ended
}

// pauseKind is why a partition is paused.
type pauseKind uint8

const (
	notPaused      pauseKind = iota
	pausedRegistry           // its records wait for the schema registry
	pausedStalled            // its source is stalled (stall.go)
)
