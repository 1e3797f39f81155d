package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commitTimeout bounds one offset commit to Kafka.
const commitTimeout = 5 * time.Second

// committer mirrors stored offsets to Kafka so that ordinary lag tools
// work. The warehouse holds the truth and Kafka's commits are never read
// back, so commits are best effort: at most one is in flight, each bounded
// by commitTimeout, and offsets that arrive meanwhile are merged into the
// next one. Failures are counted.
type committer struct {
	cl  *kgo.Client
	m   *metrics
	log *slog.Logger

	mu       sync.Mutex
	pending  map[topicPartition]kgo.EpochOffset
	inFlight bool
}

// add queues offsets stored in the warehouse and starts a commit unless one
// is in flight.
func (c *committer) add(offsets map[topicPartition]kgo.EpochOffset) {
	c.mu.Lock()
	for tp, o := range offsets {
		c.pending[tp] = o
	}
	c.mu.Unlock()
	c.start()
}

// forget drops a partition this member no longer owns.
func (c *committer) forget(tp topicPartition) {
	c.mu.Lock()
	delete(c.pending, tp)
	c.mu.Unlock()
}

func (c *committer) take() map[string]map[int32]kgo.EpochOffset {
	if len(c.pending) == 0 {
		return nil
	}
	out := map[string]map[int32]kgo.EpochOffset{}
	for tp, o := range c.pending {
		if out[tp.Topic] == nil {
			out[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		out[tp.Topic][tp.Partition] = o
	}
	clear(c.pending)
	return out
}

// start begins a commit of what is pending unless one is in flight. The
// commit is made from a goroutine of its own: CommitOffsets may wait up
// to commitTimeout for a group join before it sends anything, and may
// call its callback before it returns (when it cannot commit at all), so
// neither the writer that stored the offsets nor c.mu may be held across
// it.
func (c *committer) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inFlight {
		return
	}
	offsets := c.take()
	if offsets == nil {
		return
	}
	c.inFlight = true
	go c.commit(offsets)
}

func (c *committer) commit(offsets map[string]map[int32]kgo.EpochOffset) {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	c.cl.CommitOffsets(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cancel()
		c.done(resp, err)
		c.mu.Lock()
		c.inFlight = false
		c.mu.Unlock()
		// A commit must not be started from its own callback.
		go c.start()
	})
}

func (c *committer) done(resp *kmsg.OffsetCommitResponse, err error) {
	if err == nil && resp != nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 && err == nil {
					err = fmt.Errorf("partition %s/%d: error code %d", t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
	}
	if err != nil {
		c.m.kafkaCommits.WithLabelValues("error").Inc()
		c.log.Debug("kafka offset commit failed (informational only)", "err", err)
		return
	}
	c.m.kafkaCommits.WithLabelValues("ok").Inc()
}

// final commits what is pending before the member leaves the group,
// waiting at most commitTimeout beyond any commit in flight.
func (c *committer) final(ctx context.Context) {
	c.mu.Lock()
	offsets := c.take()
	c.mu.Unlock()
	if offsets == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	c.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		c.done(resp, err)
	})
}
