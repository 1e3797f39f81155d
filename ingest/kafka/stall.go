package kafka

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

// The sources of one ingester share its batches and their transaction. A
// source whose writes the warehouse refuses (a privilege revoked, a mirror
// that cannot be created or used, a lock or statement timeout on its
// table) stalls alone: its records leave the batch, which is written at
// once without them; its partitions are moved back to their first record
// not stored and paused, with their stored offsets untouched and nothing
// dead-lettered; and after a backoff (stallRetryFirst doubling up to
// stallRetryMax) they are fetched again and written with the next batch.
// The first write that stores them ends the stall. A refusal of single
// rows (a constraint, a type, a trigger) does not stall a source: its
// rows are then written one at a time, and those refused become dead
// letters (reason rejected).

// stallRetryFirst and stallRetryMax bound the waits between attempts at a
// stalled source.
const (
	stallRetryFirst = time.Second
	stallRetryMax   = 30 * time.Second
)

// sourceError attributes a failed step of a batch write to the source
// whose statement failed.
type sourceError struct {
	src *source
	err error
}

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// forSource attributes err, a failed step of src's part of a write, to
// src; nil stays nil, and an error attributed before keeps its source.
func forSource(src *source, err error) error {
	var se *sourceError
	if err == nil || errors.As(err, &se) {
		return err
	}
	return &sourceError{src: src, err: err}
}

// fixError is an error that says what the operator does about it.
type fixError struct {
	err error
	fix string
}

func (e *fixError) Error() string { return e.err.Error() }
func (e *fixError) Unwrap() error { return e.err }

// Stall is a source whose writes the warehouse refuses, as the ingester
// last saw it: its partitions wait while the other sources go on.
type Stall struct {
	Source string
	// Since is when its writes began to fail.
	Since time.Time
	// Err is the last failure.
	Err error
	// Fix says what to do about it.
	Fix string
	// Failures counts the attempts that failed in a row; RetryAt is when
	// its partitions are fetched again.
	Failures int
	RetryAt  time.Time
}

// Error says that the source's writes are refused, since when, why and
// what to do.
func (s Stall) Error() string {
	return fmt.Sprintf("the warehouse refuses its writes since %s (its partitions wait; the other sources go on): %v; fix: %s",
		s.Since.UTC().Format(time.RFC3339), s.Err, s.Fix)
}

// stallState is what the ingester knows of one stalled source.
type stallState struct {
	Stall
	retry backoff.Backoff
}

// stalls are the ingester's stalled sources. Its own mutex guards it:
// readiness and the status page read it while a batch is written.
type stalls struct {
	mu    sync.Mutex
	by    map[*source]*stallState
	first time.Duration // stallRetryFirst; tests shorten it
}

// failed records a failed attempt at src and returns its state.
func (s *stalls) failed(src *source, err error, fix string) Stall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[*source]*stallState{}
	}
	st := s.by[src]
	if st == nil {
		st = &stallState{Stall: Stall{Source: src.name, Since: time.Now()},
			retry: backoff.Backoff{First: cmp.Or(s.first, stallRetryFirst), Max: stallRetryMax, Jitter: 0.2}}
		s.by[src] = st
	}
	st.Err, st.Fix = err, fix
	st.RetryAt = time.Now().Add(st.retry.Next())
	st.Failures = st.retry.Failures()
	return st.Stall
}

// waiting reports whether src is stalled and its next attempt is not due.
func (s *stalls) waiting(src *source) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.by[src]
	return st != nil && time.Now().Before(st.RetryAt)
}

// retryAt is when src's next attempt is due; zero when it is not stalled.
func (s *stalls) retryAt(src *source) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.by[src]; st != nil {
		return st.RetryAt
	}
	return time.Time{}
}

// clear ends src's stall; it returns the stall it ended, if any.
func (s *stalls) clear(src *source) (Stall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.by[src]
	if st == nil {
		return Stall{}, false
	}
	delete(s.by, src)
	return st.Stall, true
}

// list returns the stalls by source name.
func (s *stalls) list() []Stall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Stall, 0, len(s.by))
	for _, st := range s.by {
		out = append(out, st.Stall)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Source < out[j].Source })
	return out
}

// Stalls lists the sources whose writes the warehouse refuses, by name:
// readiness and the status page name them.
func (in *Ingester) Stalls() []Stall { return in.stalls.list() }

// stallLocked stalls the source a failed write attempt is attributed to,
// when the warehouse refused its part: its records leave the batch, its
// partitions are moved back to their first record in it and paused until
// its next attempt is due. It reports false for a failure that is not one
// source's (the warehouse unavailable, the stop's grace ended): the batch
// is then retried whole.
func (in *Ingester) stallLocked(err error) bool {
	var se *sourceError
	if !errors.As(err, &se) || pgerr.Unavailable(err) || in.writes.Err() != nil {
		return false
	}
	src := se.src
	in.stallSourceLocked(src, err)
	in.m.writeErrors.WithLabelValues("stalled").Inc()

	// Every later record of its partitions, decoded ahead or buffered by
	// the client, is read again from where its batch began.
	if in.stopAhead != nil {
		in.stopAhead()
	}
	drop := map[topicPartition]bool{}
	seek := map[string]map[int32]kgo.EpochOffset{}
	for tp, pb := range in.b.parts {
		if pb.source != src {
			continue
		}
		drop[tp] = true
		in.reseeked[tp] = true
		if seek[tp.Topic] == nil {
			seek[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		seek[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: pb.first.Offset}
	}
	in.b.drop(drop)
	in.cl.SetOffsets(seek)
	pause := map[string][]int32{}
	for tp := range in.stored {
		if in.byTopic[tp.Topic] == src && in.paused[tp] == notPaused {
			in.paused[tp] = pausedStalled
			pause[tp.Topic] = append(pause[tp.Topic], tp.Partition)
		}
	}
	if len(pause) > 0 {
		in.cl.PauseFetchPartitions(pause)
	}
	return true
}

// stallSourceLocked records a failed attempt at src, err being attributed
// to it (a *sourceError): the metric, the log and Stalls show it.
func (in *Ingester) stallSourceLocked(src *source, err error) {
	fix := stallFix(src, err)
	st := in.stalls.failed(src, err, fix)
	in.m.stalled.WithLabelValues(src.name).Set(1)
	in.stallLog.emit(slog.LevelWarn, "stall\x00"+src.name, "the warehouse refuses a source's writes; its partitions wait, the other sources go on",
		"source", src.name, "err", err, "fix", fix, "failures", st.Failures, "retry_in", time.Until(st.RetryAt).Round(time.Millisecond))
}

// resumedLocked ends the stalls of the sources of a batch just written.
func (in *Ingester) resumedLocked(b *batch) {
	done := map[*source]bool{}
	for _, pb := range b.parts {
		if done[pb.source] {
			continue
		}
		done[pb.source] = true
		in.endStall(pb.source, "the warehouse takes a stalled source's writes again")
	}
}

// endStall ends src's stall, if any, logging why.
func (in *Ingester) endStall(src *source, why string) {
	if st, ok := in.stalls.clear(src); ok {
		in.m.stalled.WithLabelValues(src.name).Set(0)
		in.log.Info(why, "source", src.name, "stalled_for", time.Since(st.Since).Round(time.Millisecond))
	}
}

// stallFix says what to do about a failure of src's writes.
func stallFix(src *source, err error) string {
	var fe *fixError
	switch {
	case errors.As(err, &fe):
		return fe.fix
	case pgerr.InsufficientPrivilege(err):
		return fmt.Sprintf("grant the role of warehouse.dsn what it lacks on %s (tidemark grants -c FILE prints every grant the configuration needs)", src.raw.Ident())
	case pgerr.LockNotAvailable(err) || pgerr.QueryCanceled(err):
		return fmt.Sprintf("a lock on %s, or a statement over warehouse.write_timeout: find the session holding it (pg_stat_activity, pg_locks)", src.raw.Ident())
	}
	return "fix the cause in the warehouse; the source resumes by itself"
}
