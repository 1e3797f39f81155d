// Package kafkatest starts in-process Kafka-protocol brokers (kfake) for
// tests, with short group timeouts so rebalances happen quickly, and
// records what the code under test logs about them.
package kafkatest

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// NewCluster starts a kfake cluster with the given topics, each with
// partitions partitions, and closes it when the test ends.
func NewCluster(tb testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	tb.Helper()
	return NewClusterWith(tb, partitions, topics)
}

// NewClusterWith is NewCluster with extra kfake options (TLS, SASL).
func NewClusterWith(tb testing.TB, partitions int32, topics []string, extra ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	opts := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
	}, extra...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		tb.Fatalf("kafkatest: start kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Producer returns a client that produces to c, closed when the test ends.
func Producer(tb testing.TB, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	opts = append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(5 * time.Millisecond)}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		tb.Fatalf("kafkatest: producer: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// Produce writes records synchronously and fails the test on any error.
func Produce(tb testing.TB, cl *kgo.Client, records ...*kgo.Record) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
		tb.Fatalf("kafkatest: produce: %v", err)
	}
}

// Stream is a stream of records produced in the background by
// ProduceStream.
type Stream struct {
	done chan error
	mu   sync.Mutex
	end  map[int32]int64 // the next offset of each partition produced to
}

// ProduceStream produces recs through cl in the background, chunk records
// at a time with a pause between chunks (the stream's pace, so that a
// fault lands while records still arrive). The stream gives up after five
// minutes.
func ProduceStream(cl *kgo.Client, recs []*kgo.Record, chunk int, pause time.Duration) *Stream {
	s := &Stream{done: make(chan error, 1), end: map[int32]int64{}}
	chunk = max(chunk, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for i := 0; i < len(recs); i += chunk {
			res := cl.ProduceSync(ctx, recs[i:min(i+chunk, len(recs))]...)
			if err := res.FirstErr(); err != nil {
				s.done <- fmt.Errorf("kafkatest: produce: %w", err)
				return
			}
			s.mu.Lock()
			for _, r := range res {
				s.end[r.Record.Partition] = max(s.end[r.Record.Partition], r.Record.Offset+1)
			}
			s.mu.Unlock()
			time.Sleep(pause) // the pace of the stream, not a wait
		}
		s.done <- nil
	}()
	return s
}

// Wait waits until every record is produced, or the first error, and
// returns the next offset of each partition the stream produced to. It
// may be called once.
func (s *Stream) Wait() (map[int32]int64, error) {
	if err := <-s.done; err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.end), nil
}
