package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestShutdownIsBounded: a cancelled ingester returns within seconds in
// every phase, also while the group coordinator holds its JoinGroup open
// (as it does for up to the rebalance timeout while it waits for a member
// that died), and the batch in flight is still written, exactly once.
func TestShutdownIsBounded(t *testing.T) {
	// Leaving the group is given 5s; the rest allows for a loaded
	// machine. Without the bound, Run returns when the held JoinGroup
	// times out: after the rebalance timeout (60s here) plus 10s.
	const within = 15 * time.Second
	tests := []struct {
		name string
		// run starts an ingester in some phase and returns it, what
		// releases whatever holds it up, and a check made after it
		// returned.
		run func(t *testing.T, b *bundle) (r *running, release func(), check func(t *testing.T))
	}{
		{"waiting to join", func(t *testing.T, b *bundle) (*running, func(), func(*testing.T)) {
			held, release := holdJoins(t, b.kafka, 60_000)
			r := b.start(t)
			waitHeld(t, held)
			return r, release, nil
		}},
		{"rejoining with a batch in flight", func(t *testing.T, b *bundle) (*running, func(), func(*testing.T)) {
			b.batchMaxAge = "1h" // the batch is written only on shutdown
			r := b.start(t)
			n := 50
			p := &produced{end: map[int32]int64{}}
			want := map[string]bool{}
			var recs []*kgo.Record
			for i := range n {
				id := fmt.Sprintf("e%d", i)
				want[id] = true
				recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 2),
					Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z"}`, id))})
			}
			b.produce(t, p, recs)
			waitfor.Until(t, "the records to be read", func() bool {
				return counterSum(t, r, "tidemark_ingest_records_consumed_total") >= float64(n)
			})
			if got := b.storedTotal(t); got != 0 {
				t.Fatalf("%d records stored before shutdown; want the batch still in flight", got)
			}
			// A second member starts a rebalance; the coordinator holds
			// the ingester's JoinGroup.
			held, release := holdJoins(t, b.kafka, 60_000)
			joinGroup(t, b)
			waitHeld(t, held)
			return r, release, func(t *testing.T) {
				ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
				ingesttest.AssertRaw(t, b.pool, "app_events", want)
			}
		}},
		{"brokers gone", func(t *testing.T, b *bundle) (*running, func(), func(*testing.T)) {
			r := b.start(t)
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, []*kgo.Record{{Topic: b.topic, Partition: 0,
				Value: []byte(`{"event_id":"e1","event_time":"2026-10-05T10:00:00Z"}`)}})
			b.waitStored(t, p.end, time.Minute)
			b.kafka.Close()
			return r, func() {}, nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			b.rebalanceTimeout = "60s"
			r, release, check := tt.run(t, b)
			stopWithin(t, r, within, release)
			if check != nil {
				check(t)
			}
		})
	}
}

// holdJoins makes the coordinator of c hold every JoinGroup request with
// the given rebalance timeout until release is called or the test ends.
// Each held request is announced on the returned channel.
func holdJoins(t *testing.T, c *kfake.Cluster, rebalanceMillis int32) (<-chan struct{}, func()) {
	t.Helper()
	held := make(chan struct{}, 64)
	released := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	c.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.JoinGroupRequest).RebalanceTimeoutMillis != rebalanceMillis {
			return nil, nil, false
		}
		select {
		case held <- struct{}{}:
		default:
		}
		c.SleepControl(func() { <-released })
		return nil, nil, false // then answered as usual
	})
	return held, release
}

func waitHeld(t *testing.T, held <-chan struct{}) {
	t.Helper()
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no JoinGroup request arrived within a minute")
	}
}

// joinGroup adds a member to the test group that only joins it; its
// client is closed when the test ends, without waiting for a join.
func joinGroup(t *testing.T, b *bundle) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(b.topic),
		kgo.RebalanceTimeout(30*time.Second), kgo.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cl.Close()
	})
}

// stopWithin cancels r and fails the test unless Run returns within d.
// After such a failure it calls release and waits for Run a while longer.
func stopWithin(t *testing.T, r *running, d time.Duration, release func()) {
	t.Helper()
	r.once.Do(func() {
		began := time.Now()
		r.cancel()
		var err error
		select {
		case err = <-r.done:
		case <-time.After(d):
			t.Errorf("Run did not return within %s of cancellation", d)
			release()
			select {
			case err = <-r.done:
			case <-time.After(2 * time.Minute):
				t.Fatal("Run did not return within 2 minutes of cancellation")
			}
		}
		t.Logf("Run returned %s after cancellation", time.Since(began).Round(time.Millisecond))
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
