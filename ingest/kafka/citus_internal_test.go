package kafka

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCitusLoadsCommitInTwoPhases: on Citus, a load whose raw rows all go
// to one worker must still commit there in two phases. Citus commits the
// part of a worker it does not count as written with a plain COMMIT, before
// or after the coordinator's own commit, and a failure in between splits
// the load: raw rows without their ledger and offsets, or offsets without
// their rows. Rows stored one by one (after a worker refused a COPY), and
// a COPY after a probe for stored events (which reads the same shards in
// the transaction first) are such loads. The worker behind the proxy must
// receive PREPARE TRANSACTION before the write returns.
func TestCitusLoadsCommitInTwoPhases(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	for _, tc := range []struct {
		name      string
		checkRows bool
		probeLeft int
	}{
		{"rows one by one", true, 0},
		{"a COPY after a probe", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dsn, proxy := pgtest.SharedCluster(t).NewDatabaseBehindProxy(t, 1)
			h := newWriterHarnessOn(t, dsn)
			stored := map[topicPartition]position{}
			now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
			// The first batch creates the day's raw partition, whose DDL
			// commits in two phases too.
			first := h.batchOf(0, "e0")
			if _, err := h.w.write(ctx, first, stored, now, nil); err != nil {
				t.Fatal(err)
			}
			stored[tp0] = first.parts[tp0].next

			ids := IDsOnWorker(t, h.w.conn, proxy.Addr(), 2)
			proxy.Hold([]byte("PREPARE TRANSACTION"))
			h.w.probeLeft = tc.probeLeft
			done := make(chan error, 1)
			go func() {
				_, err := h.w.write(ctx, h.batchOf(1, "e0", ids[0], ids[1]), stored, now, checkAll(h.src, tc.checkRows))
				done <- err
			}()
			select {
			case <-proxy.Held():
			case err := <-done:
				t.Fatalf("the rows were committed on their worker without two-phase commit (write: %v)", err)
			case <-time.After(time.Minute):
				t.Fatal("the write neither prepared on the worker nor returned within a minute")
			}
			proxy.Release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			h.wantStored(t, "e0,"+ids[0]+","+ids[1], 1)
		})
	}
}

// IDsOnWorker returns n event ids of the form eN whose shards of
// raw.app_events are on the worker registered at addr.
func IDsOnWorker(t *testing.T, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, addr string, n int) []string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := strconv.Atoi(port)
	var ids []string
	for i := 1; i < 200 && len(ids) < n; i++ {
		id := fmt.Sprintf("e%d", i)
		var got int
		if err := q.QueryRow(context.Background(), `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('raw.app_events', $1::text)`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == want {
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		t.Fatalf("fewer than %d event ids among e1 to e199 hash to shards on the worker at %s", n, addr)
	}
	return ids
}
