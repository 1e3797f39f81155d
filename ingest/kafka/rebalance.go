package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
)

// adjustOffsets replaces the offsets Kafka would start from with the ones
// stored in the warehouse: the warehouse commit is the only truth.
func (in *Ingester) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var stored map[topicPartition]position
	for {
		var err error
		stored, err = in.readStored(ctx, offsets)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, err
		}
		in.log.Warn("cannot read stored offsets; retrying", "err", err)
		in.mu.Lock()
		in.failedLocked(err)
		in.mu.Unlock()
		in.backoff(ctx)
	}
	ends := in.logEnds(ctx, stored)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.retry.Failures() > 0 {
		in.succeededLocked()
	}
	for topic, parts := range offsets {
		for p := range parts {
			tp := topicPartition{topic, p}
			pos, ok := stored[tp]
			if end, known := ends[tp]; ok && known && pos.Offset > end {
				// The broker's log lost records (reset.go).
				parts[p] = in.start
				in.stored[tp] = pos
				in.resetLocked(tp, OffsetReset{Stored: pos.Offset, LogEnd: end, ResumedAt: "kafka.start_offset (" + in.conf.StartOffset + ")"}, 0)
			} else if ok && pos.Offset >= 0 {
				parts[p] = kgo.NewOffset().At(pos.Offset).WithEpoch(pos.Epoch)
				in.stored[tp] = pos
			} else {
				parts[p] = in.start
				in.stored[tp] = noPosition
			}
			in.log.Debug("resuming partition", "topic", topic, "partition", p, "offset", pos.Offset)
		}
	}
	return offsets, nil
}

const readStoredSQL = `
SELECT topic, partition, next_offset, leader_epoch
FROM tidemark.kafka_offsets
WHERE consumer_group = $1 AND topic = ANY($2)`

func (in *Ingester) readStored(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[topicPartition]position, error) {
	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	// A connection of its own: the writer's belongs to the main loop.
	conn, err := in.connect(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	defer pgconnect.Close(ctx, conn)
	rows, err := conn.Query(cctx, readStoredSQL, in.conf.Group, topics)
	if err != nil {
		return nil, err
	}
	out := map[topicPartition]position{}
	for rows.Next() {
		var tp topicPartition
		var p position
		if err := rows.Scan(&tp.Topic, &tp.Partition, &p.Offset, &p.Epoch); err != nil {
			return nil, err
		}
		out[tp] = p
	}
	return out, rows.Err()
}

func (in *Ingester) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	n := 0
	for _, ps := range assigned {
		n += len(ps)
	}
	in.m.assigned.Add(float64(n))
	in.log.Info("partitions assigned", "partitions", assigned)
}

// onRevoked writes the batch in flight before the partitions go to another
// member. If the warehouse stays unreachable for half the rebalance
// timeout, the revoked partitions' records are dropped from the batch
// instead: nothing of them was stored, so their next owner reads them
// again from the stored offsets.
func (in *Ingester) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	in.mu.Lock()
	defer in.mu.Unlock()
	deadline := time.Now().Add(in.conf.RebalanceTimeout / 2)
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	for !in.b.empty() {
		if err := in.flushLocked(fctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			in.log.Warn("warehouse unavailable during rebalance; dropping the revoked partitions' unwritten records (they will be read again)")
			break
		}
		// Linear, and short: the rebalance waits for this member.
		_ = backoff.Sleep(fctx, min(time.Duration(in.retry.Failures())*200*time.Millisecond, 2*time.Second))
	}
	in.forgetLocked(revoked)
	in.log.Info("partitions revoked", "partitions", revoked)
}

// onLost drops the lost partitions' unwritten records: another member may
// already own them.
func (in *Ingester) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.forgetLocked(lost)
	if len(lost) > 0 { // the client also calls this with nothing when a group session fails
		in.log.Warn("partitions lost", "partitions", lost)
	}
}

func (in *Ingester) forgetLocked(tps map[string][]int32) {
	drop := map[topicPartition]bool{}
	defer in.resumeLocked(drop)
	for topic, ps := range tps {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			drop[tp] = true
			delete(in.stored, tp)
			delete(in.resetFrom, tp)
			delete(in.hwm, tp)
			in.commits.forget(tp)
			in.m.lag.DeleteLabelValues(topic, partLabel(p))
			in.m.assigned.Dec()
		}
	}
	in.b.drop(drop)
	// A stalled source that this member owned partitions of and owns none
	// of any more is another member's to write, or to find stalled.
	owned := map[*source]bool{}
	for tp := range in.stored {
		owned[in.byTopic[tp.Topic]] = true
	}
	for tp := range drop {
		if src := in.byTopic[tp.Topic]; src != nil && !owned[src] {
			in.endStall(src, "a stalled source's partitions went to other members")
		}
	}
}
