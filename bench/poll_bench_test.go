package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// pollRows is the size of the source table of the poll benchmark.
const pollRows = 1_000_000

// pollSourceDDL is the source table: about 150 bytes a row.
const pollSourceDDL = `
CREATE TABLE src_customers (
    customer_id bigint PRIMARY KEY,
    email       text NOT NULL,
    tier        text NOT NULL,
    note        text NOT NULL,
    updated_at  timestamptz NOT NULL
);
INSERT INTO src_customers
SELECT i, 'customer' || i || '@example.com', CASE WHEN i %% 7 = 0 THEN 'pro' ELSE 'free' END, repeat('n', 90),
       timestamptz '2026-09-01 00:00+00' + i * interval '2 seconds'
FROM generate_series(1, %d) AS i;
CREATE INDEX src_customers_updated_at ON src_customers (updated_at);
ANALYZE src_customers;`

// baselineMirrorDDL is the mirror the hand-made copy of (a) fills.
const baselineMirrorDDL = `
CREATE TABLE dw_customers (
    customer_id bigint NOT NULL PRIMARY KEY,
    email       text,
    tier        text,
    note        text,
    updated_at  timestamptz,
    loaded_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
)`

// BenchmarkPoll measures a poll source on a 1M-row table, with fsync on:
//
//	(a) COPY of the table out of the source piped into COPY into an
//	    empty mirror, and (a') the same plus COPY of the rows as jsonb
//	    change rows into raw.customers: what tidemark writes, at the
//	    physical limit;
//	(b) tidemark's first load of the same table: one poll run (merge into
//	    the mirror, raw change rows, ledger, one transaction);
//	(c) a later run that absorbs 10,000 updated rows with a 30-minute
//	    lookback;
//	(d) key reconciliation of the loaded mirror after 10 hard deletes, and
//	(e) its naive baseline, pulling both full key lists and comparing them.
func BenchmarkPoll(b *testing.B) {
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	for range b.N {
		ctx := context.Background()
		e, srcDSN, src := pollSource(b, pollRows)
		srv := e.srv

		// (b2) the same load into a mirror that is not empty: merged.
		_, _, mergeTook := e.firstLoad(b, srcDSN, true)
		mergeRate := pollRows / mergeTook.Seconds()

		// (a) COPY out of the source, piped into COPY into the mirror, and
		// (b) the same rows COPYed by tidemark into empty tables, in
		// rounds alternating which goes first: one pipe of a few seconds
		// moves by a sixth from one run to the next, so each rate is the
		// median of its rounds. The last round ends with (b), whose
		// warehouse (c) and (d) go on with.
		var copyTooks, bothTooks, loadTooks []time.Duration
		var p *poll.Poller
		var wh *pgxpool.Pool
		for r := range rounds {
			measureA := func() {
				baseDSN := e.freshDatabase(b)
				prof := startProfile(b, srv, dbName(b, srcDSN), dbName(b, baseDSN))
				copyTook, rawTook := pipeCopy(b, srcDSN, baseDSN, pollRows)
				prof.report(b, "(a) and (a') COPY piped into COPY")
				copyTooks, bothTooks = append(copyTooks, copyTook), append(bothTooks, copyTook+rawTook)
			}
			measureB := func() {
				var took time.Duration
				p, wh, took = e.firstLoad(b, srcDSN, false)
				loadTooks = append(loadTooks, took)
			}
			if (rounds-1-r)%2 == 0 {
				measureA()
				measureB()
			} else {
				measureB()
				measureA()
			}
		}
		copyTook, bothTook, loadTook := medianDuration(copyTooks), medianDuration(bothTooks), medianDuration(loadTooks)
		copyRate, bothRate, loadRate := pollRows/copyTook.Seconds(), pollRows/bothTook.Seconds(), pollRows/loadTook.Seconds()

		// (c) 10,000 updates, read with a 30-minute lookback.
		if _, err := src.Exec(ctx, `UPDATE src_customers SET tier = 'gold', updated_at = timestamptz '2026-10-01 00:00+00' + customer_id * interval '1 millisecond'
			WHERE customer_id % 100 = 0`); err != nil {
			b.Fatal(err)
		}
		lookback := 30 * time.Minute
		started := time.Now()
		rep, err := p.RunOnce(ctx, poll.Window{Upper: time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC), Lookback: &lookback})
		if err != nil {
			b.Fatal(err)
		}
		incTook := time.Since(started)
		if rep.Updated != pollRows/100 {
			b.Fatalf("incremental run updated %d rows, want %d", rep.Updated, pollRows/100)
		}

		// (d) key reconciliation after 10 scattered hard deletes.
		if _, err := src.Exec(ctx, `DELETE FROM src_customers WHERE customer_id IN (1, 99999, 200001, 333333, 456789, 500000, 654321, 777777, 888888, 1000000)`); err != nil {
			b.Fatal(err)
		}
		k, err := mirror.NewKeyReconciler(p.Mirror(), srcDSN, wh, mirror.KeyOptions{})
		if err != nil {
			b.Fatal(err)
		}
		started = time.Now()
		krep, err := k.Run(ctx, true)
		if err != nil {
			b.Fatal(err)
		}
		keysTook := time.Since(started)
		if krep.Deleted != 10 {
			b.Fatalf("key reconciliation found %d deletes, want 10", krep.Deleted)
		}

		// (e) the naive comparison: both full key lists.
		started = time.Now()
		naiveFound, naiveKeys := naiveKeyDiff(b, src, wh)
		naiveTook := time.Since(started)
		if naiveFound != 10 {
			b.Fatalf("naive comparison found %d deletes, want 10", naiveFound)
		}

		b.ReportMetric(copyRate, "copy_rows/s")
		b.ReportMetric(loadRate, "poll_rows/s")
		b.ReportMetric(loadRate/copyRate, "poll/copy")
		b.ReportMetric(loadRate/bothRate, "poll/copy_both")
		b.ReportMetric(mergeRate/bothRate, "poll_merge/copy_both")
		b.ReportMetric(naiveTook.Seconds()/keysTook.Seconds(), "naive_keys/keys_time")
		fmt.Fprintf(os.Stderr, `
poll source, %d rows of about 150 bytes, fsync on, medians of %d rounds:
  (a)  COPY out of the source piped into COPY into the mirror   %8.0f rows/s  (%s)
  (a') (a) plus the same rows as jsonb change rows into raw    %8.0f rows/s  (%s)
  (b)  tidemark's first load (COPY into the empty mirror and raw table, ledger)
                                                                %8.0f rows/s  (%s)   (b)/(a) = %.2f, (b)/(a') = %.2f
  (b2) the same load into a mirror holding one other row (merge) %8.0f rows/s  (%s)   (b2)/(a') = %.2f
  (c) a run absorbing %d updates with a 30m lookback            %s
  (d) key reconciliation, 10 deletes: %d ranges compared, %d keys transferred, %s
  (e) naive full key lists: %d keys transferred, %s   (e)/(d) time = %.1fx, keys = %.0fx
`, pollRows, rounds, copyRate, copyTook.Round(time.Millisecond), bothRate, bothTook.Round(time.Millisecond),
			loadRate, loadTook.Round(time.Millisecond), loadRate/copyRate, loadRate/bothRate,
			mergeRate, mergeTook.Round(time.Millisecond), mergeRate/bothRate,
			pollRows/100, incTook.Round(time.Millisecond),
			krep.RangesCompared, krep.KeysTransferred, keysTook.Round(time.Millisecond),
			naiveKeys, naiveTook.Round(time.Millisecond), naiveTook.Seconds()/keysTook.Seconds(),
			float64(naiveKeys)/float64(max(krep.KeysTransferred, 1)))
	}
}

// pollSource starts a durable server with a source database holding
// src_customers of rows rows (pollSourceDDL), and returns the server's
// env, the source's DSN and a pool on it.
func pollSource(b *testing.B, rows int) (*env, string, *pgxpool.Pool) {
	b.Helper()
	e := &env{srv: durableServer(b)}
	srcDSN := pgtest.NewDatabaseOn(b, e.srv)
	src := pgtest.Pool(b, srcDSN)
	if _, err := src.Exec(context.Background(), fmt.Sprintf(pollSourceDDL, rows)); err != nil {
		b.Fatal(err)
	}
	return e, srcDSN, src
}

// freshDatabase settles the server (dropping the previous measurement's
// database) and creates the next measurement's, empty.
func (e *env) freshDatabase(b *testing.B) string {
	b.Helper()
	e.settle(b)
	e.last = pgtest.NewDatabaseOn(b, e.srv)
	return e.last
}

// firstLoad creates a migrated warehouse and loads the whole source into
// it in one poll run. With oneRow the mirror first holds a row the source
// does not have, so the run merges instead of COPYing into empty tables.
func (e *env) firstLoad(b *testing.B, srcDSN string, oneRow bool) (*poll.Poller, *pgxpool.Pool, time.Duration) {
	b.Helper()
	ctx := context.Background()
	whDSN := e.freshDatabase(b)
	if _, err := migrate.Up(ctx, whDSN, nil); err != nil {
		b.Fatal(err)
	}
	wh := pgtest.Pool(b, whDSN)
	p := newBenchPoller(b, whDSN, srcDSN, wh)
	if err := p.Prepare(ctx); err != nil {
		b.Fatal(err)
	}
	label := "(b) tidemark's first poll load, COPYed"
	if oneRow {
		label = "(b2) tidemark's first poll load, merged"
		if _, err := wh.Exec(ctx, `INSERT INTO dw_customers (customer_id, email, tier, note, updated_at, loaded_at)
			VALUES (-1, 'other@example.com', 'free', 'n', '2000-01-01', now())`); err != nil {
			b.Fatal(err)
		}
	}
	prof := startProfile(b, e.srv, dbName(b, srcDSN), dbName(b, whDSN))
	started := time.Now()
	rep, err := p.RunOnce(ctx, poll.Window{Upper: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(started)
	prof.report(b, label)
	if rep.Merged != pollRows || rep.Copied == oneRow {
		b.Fatalf("%s: %d rows merged (want %d), COPYed %v", label, rep.Merged, pollRows, rep.Copied)
	}
	return p, wh, took
}

func newBenchPoller(b *testing.B, whDSN, srcDSN string, wh *pgxpool.Pool) *poll.Poller {
	b.Helper()
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, max_rows_per_run: 2000000}
    mirror: {table: dw_customers}
`, whDSN, srcDSN)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	pc, err := poll.ConfigFrom(cfg, "customers")
	if err != nil {
		b.Fatal(err)
	}
	p, err := poll.New(pc, wh, poll.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// pipeCopy copies the source table into a new mirror in baseDSN with COPY
// TO STDOUT piped into COPY FROM STDIN, then the same rows as change rows
// into raw.customers, and returns how long each took; the table holds
// rows rows.
func pipeCopy(b *testing.B, srcDSN, baseDSN string, rows int64) (mirrorTook, rawTook time.Duration) {
	b.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, baseDSN, nil); err != nil {
		b.Fatal(err)
	}
	src, dst := connect(b, srcDSN), connect(b, baseDSN)
	if _, err := dst.Exec(ctx, baselineMirrorDDL); err != nil {
		b.Fatal(err)
	}
	raw := raw.NewChangeTable("customers", config.PartitionMonth)
	if err := raw.Ensure(ctx, dst); err != nil {
		b.Fatal(err)
	}
	months := []time.Time{time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}
	if err := raw.EnsurePartitions(ctx, dst, raw.Missing(months)); err != nil {
		b.Fatal(err)
	}
	pipe := func(out, in string) time.Duration {
		started := time.Now()
		pipeCOPY(b, src, dst, out, in, rows)
		return time.Since(started)
	}
	mirrorTook = pipe("COPY src_customers (customer_id, email, tier, note, updated_at) TO STDOUT",
		"COPY dw_customers (customer_id, email, tier, note, updated_at) FROM STDIN")
	rawTook = pipe(`COPY (SELECT customer_id::text, updated_at, now(), 'insert', 'public.src_customers', to_jsonb(s) FROM src_customers s) TO STDOUT`,
		"COPY raw.customers (event_id, event_time, ingested_at, op, source_table, payload) FROM STDIN")
	return mirrorTook, rawTook
}

// connect opens a connection that is closed when the benchmark ends.
func connect(b *testing.B, dsn string) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// pipeCOPY runs COPY out on src piped into COPY in on dst and fails the
// benchmark unless it moved want rows. The pipe carries 32 KiB writes: COPY
// TO STDOUT hands over one row at a time, and an unbuffered pipe would make
// every row a CopyData message and a write to the socket of its own, which
// measures the Go scheduler (it moved the baseline by a sixth between
// builds of the same code) rather than what the server can take.
func pipeCOPY(b *testing.B, src, dst *pgx.Conn, out, in string, want int64) {
	b.Helper()
	ctx := context.Background()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(pw, 32<<10)
		_, err := src.PgConn().CopyTo(ctx, w, out)
		if err == nil {
			err = w.Flush()
		}
		pw.CloseWithError(err)
		done <- err
	}()
	tag, err := dst.PgConn().CopyFrom(ctx, pr, in)
	if err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if tag.RowsAffected() != want {
		b.Fatalf("copied %d rows, want %d", tag.RowsAffected(), want)
	}
}

// naiveKeyDiff reads every key of both tables in key order and merges the
// lists; it returns the mirror keys missing at the source and how many
// keys it read.
func naiveKeyDiff(b *testing.B, src, wh *pgxpool.Pool) (found, read int64) {
	b.Helper()
	ctx := context.Background()
	keys := func(pool *pgxpool.Pool, sql string) []int64 {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			b.Fatal(err)
		}
		ks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			b.Fatal(err)
		}
		return ks
	}
	s := keys(src, "SELECT customer_id FROM src_customers ORDER BY 1")
	m := keys(wh, "SELECT customer_id FROM dw_customers WHERE deleted_at IS NULL ORDER BY 1")
	i := 0
	for _, k := range m {
		for i < len(s) && s[i] < k {
			i++
		}
		if i >= len(s) || s[i] != k {
			found++
		}
	}
	return found, int64(len(s) + len(m))
}

// medianDuration returns the median of ds.
func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(medianOf(xs))
}
