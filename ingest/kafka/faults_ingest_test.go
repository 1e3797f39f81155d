package kafka_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// recoveryBound is how soon after a fault heals the ingester must have
// caught up: the test timeouts (1s write_timeout and session limits) plus
// backoff, with room for a slow machine.
const recoveryBound = 30 * time.Second

// shortKafka are client options that give up on a silent broker within
// about a second, for the ingester and the producer of TestIngestFaults.
func shortKafka() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequestTimeoutOverhead(time.Second),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.RetryTimeout(5 * time.Second),
	}
}

// TestIngestFaults runs the Kafka ingester while the broker or the
// warehouse connection misbehaves, with records produced throughout, and
// checks that soon after the fault heals the raw table holds exactly the
// distinct good events, once each, and the stored offsets are the end
// offsets; and that nothing the ingester started outlives it.
func TestIngestFaults(t *testing.T) {
	pgtest.ServerIndependent(t)
	const parts = 2
	for _, side := range []string{"broker", "warehouse"} {
		for i, f := range faulttest.Faults {
			t.Run(side+"/"+f.Name, func(t *testing.T) {
				faulttest.CheckNoLeaks(t)
				dsn := pgtest.NewDatabase(t)
				var px *faultproxy.Proxy
				var cluster *kfake.Cluster
				if side == "broker" {
					cluster = kafkatest.NewClusterWith(t, parts, []string{"events"}, kfake.ListenFn(faultproxy.Listen(&px)))
				} else {
					cluster = kafkatest.NewCluster(t, parts, "events")
				}
				b := setupWith(t, parts, dsn, cluster, append(shortKafka(), kgo.ProduceRequestTimeout(time.Second))...)
				if side == "warehouse" {
					b.dsn, px = faulttest.Front(t, dsn)
				}
				b.warehouseYAML = ", write_timeout: 1s, idle_in_transaction_session_timeout: 1s"

				w := ingesttest.Make(b.topic, 3000, parts, uint64(100+i), 0, 0.01, testNow)
				p := &produced{end: map[int32]int64{}}
				r := b.startWith(t, kafka.Options{KafkaOpts: shortKafka(), ShutdownGrace: 5 * time.Second})
				stream := b.produceStream(p, w.Records, 100, 100*time.Millisecond)
				b.waitProgress(t, 300, 15*time.Second)
				f.Inject(px)
				time.Sleep(2 * time.Second) // the fault's duration, not a wait
				f.Heal(px)
				healed := time.Now()
				select {
				case err := <-stream:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(recoveryBound):
					t.Fatalf("producing did not finish within %s of the fault healing", recoveryBound)
				}
				b.waitStored(t, p.end, recoveryBound-time.Since(healed))
				t.Logf("caught up %s after the fault healed", time.Since(healed).Round(time.Millisecond))
				r.stop(t)

				ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
				ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
				ingesttest.AssertLedger(t, b.pool, "app_events")
			})
		}
	}
}
