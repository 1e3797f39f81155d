package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// profiling is TIDEMARK_BENCH_PGPROFILE=1: the benchmarks' server loads
// pg_stat_statements and each profiled measurement prints where
// PostgreSQL spent its time.
var profiling = os.Getenv("TIDEMARK_BENCH_PGPROFILE") != ""

// goProfileDir is TIDEMARK_BENCH_GOPROFILE: a directory the benchmarks
// write a Go CPU profile of their own process into, for each measurement
// of tidemark (startGoProfile).
var goProfileDir = os.Getenv("TIDEMARK_BENCH_GOPROFILE")

// startGoProfile starts a CPU profile of the benchmark's process, which
// runs tidemark's code, into goProfileDir/name.pprof, and returns what
// stops it; a no-op unless goProfileDir is set.
func startGoProfile(b *testing.B, name string) func() {
	b.Helper()
	if goProfileDir == "" {
		return func() {}
	}
	if err := os.MkdirAll(goProfileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(goProfileDir, name+".pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// profileSettings are the server settings profiling needs.
func profileSettings(s map[string]string) map[string]string {
	if profiling {
		s["shared_preload_libraries"] = "pg_stat_statements"
		s["pg_stat_statements.track"] = "all"
		s["track_io_timing"] = "on"
		s["track_wal_io_timing"] = "on"
	}
	return s
}

// waitSampleSQL reads what every backend of the databases (WAL senders
// included) and the WAL writer and checkpointer are doing: a wait event, on the CPU, or
// waiting for its client inside or outside a transaction.
const waitSampleSQL = `
SELECT backend_type || ' ' || pid,
       CASE WHEN state = 'idle in transaction' THEN 'Client:inside transaction'
            WHEN state = 'idle' THEN 'Client:between transactions'
            WHEN wait_event_type IS NULL THEN 'CPU'
            ELSE wait_event_type || ':' || wait_event END
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (datname = ANY($1) OR backend_type IN ('walwriter', 'checkpointer', 'background writer'))`

// statementsSQL lists the statements run in the databases since the last
// reset, by total execution time.
const statementsSQL = `
SELECT calls, total_exec_time, rows, shared_blks_hit + shared_blks_read, wal_bytes,
       regexp_replace(left(query, 110), '\s+', ' ', 'g')
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = ANY($1)
ORDER BY total_exec_time DESC
LIMIT 12`

// walSQL reads the cluster's WAL totals: bytes, flushes and flush time.
const walSQL = `SELECT wal_bytes, wal_sync, wal_sync_time, wal_write_time FROM pg_stat_wal`

// pgProfile samples the backends of some databases while a measurement
// runs.
type pgProfile struct {
	dbs   []string
	admin *pgx.Conn
	start time.Time
	stop  chan struct{}
	done  chan map[string]int
}

// startProfile starts profiling databases dbs of srv; a no-op unless
// profiling.
func startProfile(b *testing.B, srv *pgserver.Server, dbs ...string) *pgProfile {
	b.Helper()
	if !profiling {
		return nil
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{"CREATE EXTENSION IF NOT EXISTS pg_stat_statements", "SELECT pg_stat_statements_reset()", "SELECT pg_stat_reset_shared('wal')"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	p := &pgProfile{dbs: dbs, admin: admin, start: time.Now(), stop: make(chan struct{}), done: make(chan map[string]int, 1)}
	sampler, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer sampler.Close(context.Background())
		counts := map[string]int{}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				p.done <- counts
				return
			case <-tick.C:
			}
			rows, err := sampler.Query(ctx, waitSampleSQL, dbs)
			if err != nil {
				continue
			}
			for rows.Next() {
				var kind, what string
				if rows.Scan(&kind, &what) == nil {
					counts[kind+"  "+what]++
				}
			}
			rows.Close()
		}
	}()
	return p
}

// report stops the sampling and prints the profile under title.
func (p *pgProfile) report(b *testing.B, title string) {
	b.Helper()
	if p == nil {
		return
	}
	elapsed := time.Since(p.start)
	close(p.stop)
	counts := <-p.done
	ctx := context.Background()
	defer p.admin.Close(ctx)
	var out strings.Builder
	fmt.Fprintf(&out, "\nPostgreSQL profile: %s (%.1f s)\n  statements by total time:\n", title, elapsed.Seconds())
	rows, err := p.admin.Query(ctx, statementsSQL, p.dbs)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var calls, rowsN, blks, wal int64
		var total float64
		var q string
		if err := rows.Scan(&calls, &total, &rowsN, &blks, &wal, &q); err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&out, "  %8.0f ms %7d calls %9d rows %8.1f MiB WAL  %s\n", total, calls, rowsN, float64(wal)/(1<<20), q)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	var walBytes, syncs int64
	var syncMS, writeMS float64
	if err := p.admin.QueryRow(ctx, walSQL).Scan(&walBytes, &syncs, &syncMS, &writeMS); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(&out, "  WAL: %.0f MiB, %d flushes taking %.0f ms, writes %.0f ms\n", float64(walBytes)/(1<<20), syncs, syncMS, writeMS)
	fmt.Fprintf(&out, "  backend samples every 10 ms (share of samples per backend type):\n")
	// Backends that were never busy (the benchmark's own connections, the
	// idle auxiliary processes) are left out.
	perBackend, busy := map[string]int{}, map[string]int{}
	keys := make([]string, 0, len(counts))
	for k, n := range counts {
		keys = append(keys, k)
		backend, what, _ := strings.Cut(k, "  ")
		perBackend[backend] += n
		if !strings.HasPrefix(what, "Client:") && !strings.HasPrefix(what, "Activity:") {
			busy[backend] += n
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		bi, _, _ := strings.Cut(keys[i], "  ")
		bj, _, _ := strings.Cut(keys[j], "  ")
		if bi != bj {
			return bi < bj
		}
		return counts[keys[i]] > counts[keys[j]]
	})
	for _, k := range keys {
		backend, _, _ := strings.Cut(k, "  ")
		if float64(busy[backend]) < 0.05*float64(perBackend[backend]) {
			continue
		}
		if share := float64(counts[k]) / float64(perBackend[backend]); share >= 0.01 {
			fmt.Fprintf(&out, "  %5.1f%%  %s\n", 100*share, k)
		}
	}
	fmt.Fprint(os.Stderr, out.String())
}

// dbName is the database a DSN names.
func dbName(b *testing.B, dsn string) string {
	b.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	return cfg.Database
}
