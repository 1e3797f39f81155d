package kafka

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCitusCheckedRowsCommitInTwoPhases: on Citus, the rows the writer
// stores one by one (after a worker refused a COPY) must commit in two
// phases like a COPY's even when they all reach one worker. Citus would
// otherwise commit that worker's part before the coordinator's own, and a
// coordinator failing in between would keep the rows without their ledger
// and offsets. The worker behind the proxy must receive PREPARE
// TRANSACTION before the write returns.
func TestCitusCheckedRowsCommitInTwoPhases(t *testing.T) {
	if !pgtest.OnCitus() {
		t.Skip("a Citus test: make test-citus runs it (" + pgtest.EnvCitus + "=1)")
	}
	ctx := context.Background()
	dsn, proxy := pgtest.SharedCluster(t).NewDatabaseBehindProxy(t, 1)
	h := newWriterHarnessOn(t, dsn)
	stored := map[topicPartition]position{}
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	// The first batch creates the day's raw partition, whose DDL commits
	// in two phases too.
	first := h.batchOf(0, "e0")
	if _, err := h.w.write(ctx, first, stored, now, false); err != nil {
		t.Fatal(err)
	}
	stored[tp0] = first.parts[tp0].next

	_, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	proxied, _ := strconv.Atoi(port)
	id := ""
	for i := 1; i < 100 && id == ""; i++ {
		candidate := fmt.Sprintf("e%d", i)
		if h.count(t, fmt.Sprintf(`SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('raw.app_events', '%s')`, candidate)) == proxied {
			id = candidate
		}
	}
	if id == "" {
		t.Fatal("no event id among e1 to e99 hashes to a shard on the proxied worker")
	}

	proxy.Hold([]byte("PREPARE TRANSACTION"))
	done := make(chan error, 1)
	go func() {
		_, err := h.w.write(ctx, h.batchOf(1, id), stored, now, true)
		done <- err
	}()
	select {
	case <-proxy.Held():
	case err := <-done:
		t.Fatalf("the row was committed on its worker without two-phase commit (write: %v)", err)
	case <-time.After(time.Minute):
		t.Fatal("the write neither prepared on the worker nor returned within a minute")
	}
	proxy.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.wantStored(t, "e0,"+id, 0)
}
