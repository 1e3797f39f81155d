package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCitusReplayCommitsInTwoPhases: dead-letter replay probes for stored
// events inside its transaction, and on Citus a COPY over the connections
// that read the same shards would commit there without two-phase commit;
// replayed rows that all reach one worker must still be prepared there
// before the replay's own commit. The worker behind the proxy must
// receive PREPARE TRANSACTION before the replay returns.
func TestCitusReplayCommitsInTwoPhases(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	dsn, proxy := pgtest.SharedCluster(t).NewDatabaseBehindProxy(t, 1)
	b := setupOn(t, 1, dsn)
	old := rfc3339(testNow.Add(-72 * time.Hour))
	// The day's raw partition exists before the replay, whose DDL would
	// commit in two phases anyway.
	b.ingestAll(t, []*kgo.Record{event(b.topic, "seed", old)})
	ids := kafka.IDsOnWorker(t, b.pool, proxy.Addr(), 2)
	b.maxAge = "1d"
	b.ingestAll(t, []*kgo.Record{event(b.topic, ids[0], old), event(b.topic, ids[1], old)})
	b.maxAge = "30d"

	ctx := context.Background()
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	cfg := b.config(t)
	proxy.Hold([]byte("PREPARE TRANSACTION"))
	type outcome struct {
		rep kafka.ReplayReport
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		rep, err := kafka.Replay(ctx, c.Conn(), kafka.ConfigFrom(cfg), kafka.ReplayOptions{Source: "app_events", Now: b.clock.Now})
		done <- outcome{rep, err}
	}()
	select {
	case <-proxy.Held():
	case o := <-done:
		t.Fatalf("the replayed rows were committed on their worker without two-phase commit (replay: %+v, %v)", o.rep, o.err)
	case <-time.After(time.Minute):
		t.Fatal("the replay neither prepared on the worker nor returned within a minute")
	}
	proxy.Release()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	checkReport(t, "replay", o.rep, 2, 0, map[string]int{})
	assertRawIDs(t, b, map[string]bool{"seed": true, ids[0]: true, ids[1]: true})
}
