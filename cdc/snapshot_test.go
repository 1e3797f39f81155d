package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/mirror"
)

// TestCopyChunkBounded copies one snapshot chunk of 50000 rows from a
// source behind a slow network for several times write_timeout: data
// keeps moving, so the chunk is copied whole. The same copy through a
// network that stalls in the middle of it, on the source's side or on the
// warehouse's, ends with ErrNoProgress within write_timeout of the stall
// (on the warehouse's side, of the last rows sent into it), where it
// waited for good before, and leaves nothing in the mirror. The fault
// strikes only the chunk's connections, so the chunk's own bound is what
// ends it, not the reader's other sessions noticing.
//
// A slow warehouse is not among the cases: the client sees a COPY's rows
// leave when the kernel takes them, so the last few megabytes of socket
// buffers must reach the warehouse and be written within write_timeout,
// which a network slowed to a few MB/s against a write_timeout of half a
// second does not allow.
func TestCopyChunkBounded(t *testing.T) {
	const (
		rows = 50000
		step = 500 * time.Millisecond
	)
	ctx := context.Background()
	srcPool, srcDSN := pgtest.NewPool(t)
	whDSN := pgtest.NewDatabase(t)
	if _, err := srcPool.Exec(ctx, fmt.Sprintf(`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, amount numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL);
		INSERT INTO orders SELECT i, i %% 100, i %% 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second' FROM generate_series(1, %d) AS i`, rows)); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte(fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders]}
    mirror: {schema: mirror}
`, whDSN, srcDSN)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	src, err := ConfigFrom(cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	src.Distribute = false
	id := src.Tables[0].Source
	setup, err := mirror.Connect(ctx, srcDSN, "tidemark-test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := describeMirror(ctx, setup, &src, src.Tables[0])
	setup.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wh, err := pgx.Connect(ctx, whDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close(ctx)
	if err := m.Ensure(ctx, wh); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		side    string // "source" or "warehouse"
		latency time.Duration
		stall   bool
	}{
		{"slow source", "source", 10 * time.Millisecond, false},
		{"source stalls", "source", 10 * time.Millisecond, true},
		{"warehouse stalls", "warehouse", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			faulttest.CheckNoLeaks(t)
			if _, err := wh.Exec(ctx, "TRUNCATE "+m.Target.Sanitize()); err != nil {
				t.Fatal(err)
			}
			sdsn, wdsn := srcDSN+"&connect_timeout=2", whDSN+"&connect_timeout=2"
			var px *faultproxy.Proxy
			if tt.side == "source" {
				sdsn, px = faulttest.Front(t, sdsn)
			} else {
				wdsn, px = faulttest.Front(t, wdsn)
			}
			w := cfg.Warehouse
			w.DSN = wdsn
			pool, err := pgconnect.Pool(ctx, w.Settings(), "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			conn, err := mirror.Connect(ctx, sdsn, "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			r := &Reader{conf: src, pool: pool, log: slog.New(slog.DiscardHandler), waitTimeout: step}
			c := chunk{t: &table{name: "public.orders", mirror: m}, id: id, where: "true"}

			px.SetLatency(tt.latency)
			stalled := make(chan time.Time, 1)
			if tt.stall {
				// The stall strikes once rows of the COPY have passed
				// from the source into the warehouse: in its middle.
				var once sync.Once
				r.opts.chunkMoving = func() {
					once.Do(func() {
						px.Stall()
						stalled <- time.Now()
					})
				}
			}
			started := time.Now()
			n, err := r.copyChunk(ctx, conn, c, "2026-12-01 00:00:00+00")
			took := time.Since(started)
			t.Logf("copyChunk returned after %s: %d rows, %v; proxy %+v", took.Round(time.Millisecond), n, err, px.Stats())
			if !tt.stall {
				if err != nil {
					t.Fatal(err)
				}
				if n != rows {
					t.Errorf("%d rows copied, want %d", n, rows)
				}
				if took < 2*step {
					t.Errorf("the copy took %s, not longer than twice write_timeout (%s): the test did not exercise a long chunk", took, step)
				}
				return
			}
			var at time.Time
			select {
			case at = <-stalled:
			default:
				t.Fatal("no rows of the COPY were seen passing: the test did not stall it")
			}
			if !errors.Is(err, pgconnect.ErrNoProgress) {
				t.Fatalf("copy through a stall ended with %v, want ErrNoProgress", err)
			}
			if after := time.Since(at); after > step+2*time.Second {
				t.Errorf("the copy ended %s after the stall, want within write_timeout (%s) and the rows in flight", after, step)
			}
			if got := mustCount(t, wh, "SELECT count(*) FROM "+m.Target.Sanitize()); got != 0 {
				t.Errorf("%d rows in the mirror after a failed chunk, want none", got)
			}
		})
	}
}

// mustCount runs a count query on conn.
func mustCount(t *testing.T, conn *pgx.Conn, sql string) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPlanChunksOfAnUnanalyzedTable plans the snapshot of a table that
// was never analyzed and is larger than countPages: its rows are
// estimated on a block sample rather than counted (planning must stay
// inside write_timeout whatever the size), and the chunks still cover
// every row exactly once.
func TestPlanChunksOfAnUnanalyzedTable(t *testing.T) {
	const rows = 20000
	ctx := context.Background()
	srcPool, srcDSN := pgtest.NewPool(t)
	if _, err := srcPool.Exec(ctx, fmt.Sprintf(`CREATE TABLE orders (id bigint PRIMARY KEY, note text NOT NULL) WITH (autovacuum_enabled = false);
		INSERT INTO orders SELECT i, repeat('x', 50) FROM generate_series(1, %d) AS i`, rows)); err != nil {
		t.Fatal(err)
	}
	var reltuples float64
	if err := srcPool.QueryRow(ctx, "SELECT reltuples::float8 FROM pg_class WHERE oid = 'orders'::regclass").Scan(&reltuples); err != nil {
		t.Fatal(err)
	}
	if reltuples >= 0 {
		t.Fatalf("the table was analyzed (reltuples %v); the test needs one that was not", reltuples)
	}
	old := countPages
	countPages = 8 // the table has about 200 blocks: sample it
	t.Cleanup(func() { countPages = old })

	cfg, err := config.Parse("t.yaml", []byte(fmt.Sprintf(`warehouse: {dsn: "postgres://localhost/w"}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders]}
    mirror: {schema: mirror}
`, srcDSN)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mirror.Connect(ctx, srcDSN, "tidemark-test")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	src, err := ConfigFrom(cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	src.Distribute = false
	id := src.Tables[0].Source
	m, err := describeMirror(ctx, conn, &src, src.Tables[0])
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	est, pages, err := estimateUnanalyzed(ctx, tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if pages < 100 || est < rows/4 || est > rows*4 {
		t.Errorf("estimate of %d rows: %v rows in %v blocks", rows, est, pages)
	}
	wheres, err := planChunks(ctx, tx, &table{name: "public.orders", mirror: m}, id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(wheres) < 2 {
		t.Fatalf("%d chunks planned for %d rows of 1000 a chunk", len(wheres), rows)
	}
	var sum []string
	for _, w := range wheres {
		sum = append(sum, "("+w+")::int")
	}
	var outside int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM orders WHERE "+strings.Join(sum, " + ")+" <> 1").Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if outside != 0 {
		t.Errorf("%d rows are in no chunk or in more than one", outside)
	}
}
