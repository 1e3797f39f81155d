package kafka

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestCommitterNeverBlocksTheWriter adds offsets while the client cannot
// commit at once: franz-go then calls the commit's callback before
// CommitOffsets returns (here because the client is in no group; during a
// group join, after waiting up to commitTimeout). add must return at
// once, the failure must be counted, and the next add must commit again.
// The committer used to call CommitOffsets holding its own lock, which
// that callback takes: the writer, which holds the ingester's lock while
// it hands over offsets, hung for good, and with it every rebalance
// callback.
func TestCommitterNeverBlocksTheWriter(t *testing.T) {
	c := kafkatest.NewCluster(t, 1, "events")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	m := newMetrics(prometheus.NewRegistry(), []string{"events"})
	com := &committer{cl: cl, m: m, log: slog.New(slog.DiscardHandler), pending: map[topicPartition]kgo.EpochOffset{}}
	failed := m.kafkaCommits.WithLabelValues("error")
	for i := range 3 {
		added := make(chan struct{})
		go func() {
			com.add(map[topicPartition]kgo.EpochOffset{{Topic: "events", Partition: 0}: {Epoch: -1, Offset: int64(i + 1)}})
			close(added)
		}()
		select {
		case <-added:
		case <-time.After(5 * time.Second):
			t.Fatalf("add %d did not return within 5s", i)
		}
		if err := waitfor.Poll(waitfor.Timeout, func() bool { return testutil.ToFloat64(failed) >= float64(i+1) }); err != nil {
			t.Fatalf("commit %d: %v failures counted, want %d", i, testutil.ToFloat64(failed), i+1)
		}
		waitfor.Until(t, fmt.Sprintf("commit %d to be no longer in flight", i), func() bool {
			com.mu.Lock()
			defer com.mu.Unlock()
			return !com.inFlight
		})
	}
}
