// Package kafkatest starts in-process Kafka-protocol brokers (kfake) for
// tests, with short group timeouts so rebalances happen quickly, and
// records what the code under test logs about them.
package kafkatest

import (
	"context"
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
