package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/raw"
)

// BenchmarkRawKeyCollation measures what the collation of the raw tables'
// event_id costs a COPY, in a warehouse database whose default collation
// is linguistic (TIDEMARK_BENCH_LOCALE, en_US.UTF-8), as production
// databases' often is: the same rows into the table as tidemark creates it
// (event_id COLLATE "C", compared byte by byte) and into the same table
// with event_id in the database's collation, as tidemark created it
// before. Both the events table of a Kafka source and the change table of
// a CDC source are measured, in TIDEMARK_BENCH_ROUNDS rounds (3) of
// alternating order; the run reports the median ratio of the rates. It is
// skipped when the operating system lacks the locale.
func BenchmarkRawKeyCollation(b *testing.B) {
	n := size("TIDEMARK_BENCH_COLLATION_ROWS", 1_000_000, 100_000)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	locale := os.Getenv("TIDEMARK_BENCH_LOCALE")
	if locale == "" {
		locale = "en_US.UTF-8"
	}
	for range b.N {
		srv := durableServer(b)
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, srv.URL("postgres"))
		if err != nil {
			b.Fatal(err)
		}
		_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE bench_collation TEMPLATE template0 ENCODING 'UTF8' LOCALE '%s'`, strings.ReplaceAll(locale, "'", "''")))
		if err != nil {
			_ = admin.Close(ctx)
			b.Skipf("a database with locale %s: %v (on Debian: apt-get install locales; localedef -i en_US -f UTF-8 en_US.UTF-8)", locale, err)
		}
		conn, err := pgx.Connect(ctx, srv.URL("bench_collation"))
		if err != nil {
			b.Fatal(err)
		}
		recs, _ := workload(n)
		events, times := decodedRows(b, recs)
		changes := changeRows(n)
		fmt.Fprintf(os.Stderr, "\nraw table key collation, %d rows, a database with locale %s, fsync on:\n", n, locale)
		for _, kind := range []struct {
			name    string
			metric  string
			table   func(source string) *raw.Table
			columns []string
			rows    [][]any
			times   []time.Time
		}{
			{"Kafka events", "events_c/db_collation", func(s string) *raw.Table { return raw.NewTable(s, config.PartitionDay) },
				[]string{"event_id", "event_time", "ingested_at", "payload", "kafka_topic", "kafka_partition", "kafka_offset"}, events, times},
			{"CDC changes", "changes_c/db_collation", func(s string) *raw.Table { return raw.NewChangeTable(s, config.PartitionDay) },
				[]string{"event_id", "event_time", "ingested_at", "op", "source_table", "payload", "row_key", "old_row"}, changes, []time.Time{benchNow}},
		} {
			var ratios []float64
			for r := range rounds {
				rateC, rateDB := 0.0, 0.0
				for i := range 2 {
					byteWise := (i+r)%2 == 0
					rate, cpu := copyIntoFresh(b, conn, kind.table, byteWise, kind.columns, kind.rows, kind.times)
					what := `COLLATE "C" (tidemark)`
					if byteWise {
						rateC = rate
					} else {
						rateDB, what = rate, "the database's collation"
					}
					fmt.Fprintf(os.Stderr, "  %s, round %d: event_id %-26s %8.0f rows/s, PostgreSQL CPU %.2f s per million rows\n",
						kind.name, r+1, what, rate, cpu.Seconds()*1e6/float64(len(kind.rows)))
				}
				ratios = append(ratios, rateC/rateDB)
			}
			ratio := medianOf(ratios)
			fmt.Fprintf(os.Stderr, "  %s: median rate with COLLATE \"C\" / with the database's collation = %.2f over %d rounds\n", kind.name, ratio, rounds)
			b.ReportMetric(ratio, kind.metric)
		}
		_ = conn.Close(ctx)
		_ = admin.Close(ctx)
	}
}

// copyIntoFresh drops and recreates raw.coll (event_id COLLATE "C" when
// byteWise, the database's collation otherwise), checkpoints, and COPYs
// the rows into it, returning the rate and the server's CPU time.
func copyIntoFresh(b *testing.B, conn *pgx.Conn, table func(string) *raw.Table, byteWise bool, columns []string, rows [][]any, times []time.Time) (float64, time.Duration) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{`DROP TABLE IF EXISTS raw.coll`, `CREATE SCHEMA IF NOT EXISTS raw`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	raw := table("coll")
	if err := raw.Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	if !byteWise {
		// The empty table, as tidemark created it before: no rows to
		// rewrite, the key index is rebuilt empty.
		if _, err := conn.Exec(ctx, `ALTER TABLE raw.coll ALTER COLUMN event_id TYPE text COLLATE "default"`); err != nil {
			b.Fatal(err)
		}
	}
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(times)); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
	backend := int(conn.PgConn().PID())
	cpu0 := treeCPU(backend)
	start := time.Now()
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"raw", "coll"}, columns, pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	cpu := treeCPU(backend)
	if cpu == 0 {
		b.Fatalf("reading the CPU time of backend %d from /proc failed", backend)
	}
	return float64(len(rows)) / took.Seconds(), time.Duration(cpu-cpu0) * clockTick
}

// changeRows returns n change rows shaped as a CDC reader writes them:
// ids of commit LSN and position, jsonb rows of about 150 bytes, all on
// benchNow's day.
func changeRows(n int) [][]any {
	rows := make([][]any, n)
	for i := range rows {
		lsn := 0x1000000 + uint64(i/1000)*0x10000
		payload := fmt.Sprintf(`{"id":"%d","customer_id":"%d","amount":"%d.%02d","status":"paid","note":"%032x","placed_at":"2026-10-05 12:00:00+00"}`,
			i, i%5000, i%500, i%100, uint64(i)*0x9e3779b97f4a7c15)
		rows[i] = []any{fmt.Sprintf("%X/%X/%d", lsn>>32, uint32(lsn), i%1000), benchNow, benchNow, "insert", "public.orders",
			[]byte(payload), fmt.Sprint(i), nil}
	}
	return rows
}
