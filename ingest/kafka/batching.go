package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
)

// batchSize is the records and bytes of the batch in flight.
func (in *Ingester) batchSize() (rows, bytes int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.b.len(), in.b.bytes
}

// full reports whether a batch of rows records taking bytes bytes is a
// batch's worth: ingest.batch_max_rows or ingest.batch_max_bytes.
func (c *Config) full(rows, bytes int) bool {
	return rows >= c.BatchMaxRows || int64(bytes) >= c.BatchMaxBytes
}

// flushDue reports whether the batch in flight is to be written: it is
// full or has reached ingest.batch_max_age.
func (in *Ingester) flushDue() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.b.empty() {
		return false
	}
	return in.conf.full(in.b.len(), in.b.bytes) || !time.Now().Before(in.b.started.Add(in.conf.BatchMaxAge))
}

func (in *Ingester) batchDeadline() (time.Time, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.b.empty() {
		return time.Time{}, false
	}
	return in.b.started.Add(in.conf.BatchMaxAge), true
}

// decodeAhead decodes fetches and, if there were any, goes on polling and
// decoding until it holds a batch's worth of records (full) or ctx ends
// with the write. It reads nothing that mu guards.
func (in *Ingester) decodeAhead(ctx context.Context, fetches kgo.Fetches) []decodedPart {
	parts := in.decode(ctx, fetches)
	if len(fetches) == 0 {
		return parts
	}
	rows, bytes, counted := 0, 0, 0
	for {
		for _, d := range parts[counted:] {
			rows += len(d.recs)
			bytes += d.size
		}
		counted = len(parts)
		if in.conf.full(rows, bytes) || ctx.Err() != nil {
			return parts
		}
		if in.ahead.polling != nil {
			in.ahead.polling(rows)
		}
		fetches = in.cl.PollRecords(ctx, in.pollRows(rows, bytes))
		if in.ahead.polled != nil {
			in.ahead.polled()
		}
		parts = append(parts, in.decode(ctx, fetches)...)
	}
}

// decodedPart is one partition's polled records, decoded.
type decodedPart struct {
	tp   topicPartition
	hwm  int64
	src  *source // nil for a topic of no source
	recs []*kgo.Record
	evs  []decode.Event
	rejs []*decode.Rejection
	// size approximates the memory the records take in a batch, decoded
	// (rowBytes; recordBytes for those rejected).
	size int
	// wait, when set, is where the records not decoded begin: they wait
	// for their schema (recs holds only those before).
	wait *pendingPart
	// loss, when set, is a loss of records the client detected at the
	// broker (reset.go); the part holds no records.
	loss *kgo.ErrDataLoss
}

// absorb decodes polled records into the batch.
func (in *Ingester) absorb(ctx context.Context, fetches kgo.Fetches) {
	parts := in.decode(ctx, fetches)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.addLocked(parts, nil)
}

// decode logs the fetch errors and decodes the records, getting the
// schemas of a registry format first (within ctx); it reads nothing that
// mu guards.
func (in *Ingester) decode(ctx context.Context, fetches kgo.Fetches) []decodedPart {
	var parts []decodedPart
	fetches.EachError(func(topic string, partition int32, err error) {
		if dl, ok := dataLoss(err); ok {
			tp := topicPartition{topic, partition}
			parts = append(parts, decodedPart{tp: tp, src: in.byTopic[topic], loss: dl})
			return
		}
		var session *kgo.ErrGroupSession
		var tooLarge *kgo.ErrDecompressTooLarge
		if errors.As(err, &tooLarge) {
			// The client stops fetching the partition; it is read again
			// from the batch by a client with a larger bound.
			in.klog.emit(slog.LevelError, fmt.Sprintf("decompress\x00%s\x00%d", topic, partition),
				"a record batch decompresses to more than the larger of ingest.memory_max_bytes and ingest.decode_max_bytes; "+
					"the partition waits at the batch (nothing is skipped): raise ingest.memory_max_bytes and restart",
				"topic", topic, "partition", partition, "offset", tooLarge.Offset, "limit_bytes", in.conf.DecompressMaxBytes)
			return
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) ||
			errors.As(err, &session) { // the client logs why the group session ended
			return
		}
		in.klog.emit(slog.LevelWarn, fmt.Sprintf("fetch\x00%s\x00%d", topic, partition), "fetch error",
			"topic", topic, "partition", partition, "err", err)
	})
	now := in.now()
	// No request for the schemas of one fetch starts after one registry
	// timeout, so that resolving them takes two at most: a poll holds
	// rebalances until its records are decoded. The partitions left
	// waiting are read again at the next poll.
	until := time.Now().Add(in.conf.RegistryTimeout)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		d := decodedPart{tp: topicPartition{p.Topic, p.Partition}, hwm: p.HighWatermark, src: in.byTopic[p.Topic]}
		if d.src != nil {
			d.recs = p.Records
			var schemas decode.Schemas
			if d.src.dec.UsesRegistry() && len(p.Records) > 0 {
				var n int
				var pause bool
				schemas, n, pause = in.resolve(ctx, d.src, d.tp, p.Records, until)
				if n < len(p.Records) {
					d.wait = &pendingPart{offset: p.Records[n].Offset}
					if pause {
						d.wait.pause = pausedRegistry
					}
					d.recs = p.Records[:n]
				}
			}
			d.evs, d.rejs = make([]decode.Event, len(d.recs)), make([]*decode.Rejection, len(d.recs))
			for i, r := range d.recs {
				d.evs[i], d.rejs[i] = d.src.dec.DecodeWith(r, now, schemas)
				if d.rejs[i] != nil {
					d.size += recordBytes(r)
				} else {
					d.size += rowBytes(r, &d.evs[i])
				}
			}
		}
		parts = append(parts, d)
	})
	in.noteRecordBytes(parts)
	return parts
}

// addLocked adds decoded records to the batch, skipping those already
// stored and those of the partitions in stale: partitions a write moved to
// another member's stored position after the records were fetched (they
// are read again from there).
func (in *Ingester) addLocked(parts []decodedPart, stale map[topicPartition]bool) {
	now, n := time.Now(), 0
	for _, d := range parts {
		n += len(d.recs)
	}
	in.b.rows = slices.Grow(in.b.rows, n)
	waiting := map[topicPartition]pendingPart{}
	for _, d := range parts {
		in.hwm[d.tp] = d.hwm
		if _, ok := waiting[d.tp]; d.src == nil || stale[d.tp] || ok {
			continue // a partition waiting for a schema takes nothing after the record that waits
		}
		if d.wait != nil {
			waiting[d.tp] = *d.wait
		}
		if d.loss != nil {
			in.dataLossLocked(d.tp, d.loss)
			continue
		}
		floor, owned := in.stored[d.tp]
		from, reset := in.resetFrom[d.tp]
		if owned && floor.Offset >= 0 {
			in.m.lag.WithLabelValues(d.tp.Topic, partLabel(d.tp.Partition)).Set(float64(max(0, d.hwm-floor.Offset)))
		}
		if in.stalls.waiting(d.src) {
			// Its source is stalled: the records wait with their
			// partition, from the first not stored.
			for _, r := range d.recs {
				if !owned || r.Offset >= floor.Offset || reset && r.Offset >= from {
					waiting[d.tp] = pendingPart{offset: r.Offset, pause: pausedStalled}
					break
				}
			}
			continue
		}
		added := 0
		for i, r := range d.recs {
			if owned && r.Offset < floor.Offset && !(reset && r.Offset >= from) {
				continue // already stored; never write a record twice
			}
			rej := d.rejs[i]
			if rej == nil && d.src.mirror != nil {
				rej = d.src.mirror.check(d.evs[i].Change)
			}
			in.b.add(d.src, r, d.evs[i], rej, now)
			added++
		}
		in.m.consumed.WithLabelValues(d.src.name).Add(float64(added))
	}
	in.rewindLocked(waiting)
}
