package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition whose stored position is beyond the end of the broker's log
// lost records at the broker: the topic was deleted and created again, or
// a broker lost data. Its records below the stored position are then new
// records, not ones stored before. When a partition is assigned, the
// ingester compares its stored position with the log's end; one beyond it
// starts at kafka.start_offset, as configuration.md says, and its records
// load from there although they are below the stored position (resetFrom),
// until its first write moves the stored position. When the client
// detects such a loss while consuming (kgo.ErrDataLoss), the records from
// where it resumed load the same way.

// logEndTimeout bounds asking the brokers where the assigned partitions'
// logs end.
const logEndTimeout = 10 * time.Second

// maxResets bounds the resets Resets keeps, the latest.
const maxResets = 32

// OffsetReset is a partition whose stored position was beyond the end of
// the broker's log, started again below it.
type OffsetReset struct {
	Source    string
	Topic     string
	Partition int32
	// At is when the ingester found it.
	At time.Time
	// Stored is the position the warehouse held; LogEnd where the
	// broker's log ended (-1 when the client reported the loss).
	Stored, LogEnd int64
	// ResumedAt says where reading began again: kafka.start_offset, or
	// the offset the client resumed at.
	ResumedAt string
}

func (r OffsetReset) String() string {
	end := "the broker lost records"
	if r.LogEnd >= 0 {
		end = "the broker's log ends at " + strconv.FormatInt(r.LogEnd, 10)
	}
	return fmt.Sprintf("%s/%d: stored position %d, but %s (topic recreated or data lost); read again from %s",
		r.Topic, r.Partition, r.Stored, end, r.ResumedAt)
}

// Resets returns the latest partitions (at most maxResets) whose stored
// position was beyond the broker's log, oldest first: the status page
// shows them.
func (in *Ingester) Resets() []OffsetReset {
	in.resetsMu.Lock()
	defer in.resetsMu.Unlock()
	return slices.Clone(in.resets)
}

// logEnds asks the brokers where the logs of the partitions of stored
// with a position end. A partition it could not learn is left out: its
// position is used as it is.
func (in *Ingester) logEnds(ctx context.Context, stored map[topicPartition]position) map[topicPartition]int64 {
	var topics []string
	for tp, pos := range stored {
		if pos.Offset > 0 && !slices.Contains(topics, tp.Topic) {
			topics = append(topics, tp.Topic)
		}
	}
	ends := map[topicPartition]int64{}
	if len(topics) == 0 {
		return ends
	}
	ctx, cancel := context.WithTimeout(ctx, logEndTimeout)
	defer cancel()
	listed, err := kadm.NewClient(in.cl).ListEndOffsets(ctx, topics...)
	if err != nil {
		in.log.Debug("could not ask where the assigned partitions' logs end; resuming at the stored positions", "err", err)
		return ends
	}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			ends[topicPartition{o.Topic, o.Partition}] = o.Offset
		}
	})
	return ends
}

// resetLocked takes note that tp, whose stored position was beyond the
// broker's log, is read again from below it: its records from from on
// load until its next write.
func (in *Ingester) resetLocked(tp topicPartition, r OffsetReset, from int64) {
	in.resetFrom[tp] = from
	if src := in.byTopic[tp.Topic]; src != nil {
		r.Source = src.name
		in.m.offsetResets.WithLabelValues(src.name).Inc()
	}
	r.Topic, r.Partition, r.At = tp.Topic, tp.Partition, time.Now()
	in.log.Warn("a partition's stored position is beyond the broker's log (the topic was recreated or the broker lost records); reading it again from below",
		"source", r.Source, "topic", tp.Topic, "partition", tp.Partition, "stored_offset", r.Stored, "log_end", r.LogEnd, "resumed_at", r.ResumedAt)
	in.resetsMu.Lock()
	defer in.resetsMu.Unlock()
	in.resets = append(in.resets, r)
	if len(in.resets) > maxResets {
		in.resets = slices.Delete(in.resets, 0, len(in.resets)-maxResets)
	}
}

// dataLoss returns the loss the client reported in err, if any.
func dataLoss(err error) (*kgo.ErrDataLoss, bool) {
	var dl *kgo.ErrDataLoss
	return dl, errors.As(err, &dl)
}

// dataLossLocked takes note of a loss the client detected while
// consuming tp: it resumed at dl.ResetTo, and the records from there load
// although they are below the stored position.
func (in *Ingester) dataLossLocked(tp topicPartition, dl *kgo.ErrDataLoss) {
	floor, owned := in.stored[tp]
	if !owned || dl.ResetTo >= floor.Offset {
		in.log.Warn("the broker lost records of a partition; nothing stored is read again", "topic", tp.Topic, "partition", tp.Partition, "err", dl)
		return
	}
	in.resetLocked(tp, OffsetReset{Stored: floor.Offset, LogEnd: -1, ResumedAt: "offset " + strconv.FormatInt(dl.ResetTo, 10)}, dl.ResetTo)
}
