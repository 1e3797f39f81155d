package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// debeziumChanges is how many row changes BenchmarkDebezium applies.
var debeziumChanges = size("TIDEMARK_BENCH_DEBEZIUM_CHANGES", 200_000, 20_000)

// debeziumTarget is the Debezium apply rate BenchmarkDebezium aims for, as
// a share of the CDC reader's apply rate of the same changes.
const debeziumTarget = 0.8

// BenchmarkDebezium measures the apply of Debezium change events against
// the CDC reader's apply of the same changes, on one server with fsync on:
//
//	(a) the CDC reader applying BenchmarkCDC's workload (inserts, updates,
//	    deletes in transactions of 1,000) from its slot: raw change rows,
//	    ledger, mirror, positions;
//	(b) the same changes, read back from (a)'s raw change rows in source
//	    order, as the Debezium PostgreSQL connector writes them with the
//	    JSON converter and schemas (every other update with note as the
//	    unchanged-TOAST placeholder), on a topic of one partition, drained
//	    by one ingester: raw change rows, ledger, a mirror created from
//	    the schema, offsets.
//
// Each round has its own slot (made before the workload) and warehouse
// databases; rounds alternate which of (a) and (b) goes first, and the two
// mirrors must end equal. Reported: the median of the rounds' (b)/(a).
func BenchmarkDebezium(b *testing.B) {
	for range b.N {
		ctx := context.Background()
		srv := durableServer(b)
		e := &env{srv: srv}
		rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
		srcDSN, src, wh, cfg := cdcSlots(b, srv)
		if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot('bench_decode')`); err != nil {
			b.Fatal(err)
		}
		readers := []cdcRound{{wh: wh, cfg: cfg}}
		for r := 1; r < rounds; r++ {
			readers = append(readers, newCDCRound(b, srv, srcDSN, r))
		}
		end := writeCDCWorkload(b, src, debeziumChanges)
		if _, err := src.Exec(ctx, `VACUUM (ANALYZE) orders`); err != nil {
			b.Fatal(err)
		}
		cdcRates := []float64{readers[0].measure(b, e, end)}
		recs := debeziumRecords(b, wh)
		want := mirrorDigest(b, wh)
		e.kc = newCluster(b, 1)
		e.produce(b, recs)
		var ratios, dbzRates []float64
		for round := range rounds {
			var rate float64
			switch {
			case round == 0:
				rate = measureDebezium(b, e, len(recs), round, want)
			case round%2 == 1:
				rate = measureDebezium(b, e, len(recs), round, want)
				cdcRates = append(cdcRates, readers[round].measure(b, e, end))
			default:
				cdcRates = append(cdcRates, readers[round].measure(b, e, end))
				rate = measureDebezium(b, e, len(recs), round, want)
			}
			dbzRates = append(dbzRates, rate)
			ratios = append(ratios, rate/cdcRates[round])
			b.Logf("round %d: (a) CDC apply %.0f changes/s, (b) Debezium apply %.0f changes/s, (b)/(a) %.2f", round+1, cdcRates[round], rate, rate/cdcRates[round])
		}
		ratio := medianOf(ratios)
		b.ReportMetric(ratio, "debezium/cdc")
		b.ReportMetric(medianOf(cdcRates), "cdc_changes/s")
		b.ReportMetric(medianOf(dbzRates), "debezium_changes/s")
		b.Logf("Debezium apply: median (b)/(a) of %d rounds %.2f (target >= %.1f)", rounds, ratio, debeziumTarget)
	}
}

// cdcRound is a CDC reader's warehouse and configuration, with a slot of
// its own holding the workload's changes.
type cdcRound struct {
	wh  *pgxpool.Pool
	cfg *config.Config
}

// newCDCRound makes a warehouse database and a reader of srcDSN into it
// with slot bench_round_<r>, which it creates and leaves, its (empty)
// snapshot taken.
func newCDCRound(b *testing.B, srv *pgserver.Server, srcDSN string, r int) cdcRound {
	b.Helper()
	whDSN := pgtest.NewDatabaseOn(b, srv)
	wh, cfg := cdcWarehouse(b, whDSN, srcDSN, "orders", "{table: dw_orders}")
	cfg.Sources["shop"].CDC.Slot = fmt.Sprintf("bench_round_%d", r)
	rd := startReader(b, cfg, wh)
	rd.waitSnapshotDone(b, wh)
	rd.stop(b)
	return cdcRound{wh: wh, cfg: cfg}
}

// measure applies the workload with the round's reader and returns the
// changes applied per second.
func (c cdcRound) measure(b *testing.B, e *env, end string) float64 {
	b.Helper()
	e.settle(b)
	waitNoAutovacuum(b, e.srv)
	started := time.Now()
	rd := startReader(b, c.cfg, c.wh)
	rd.waitApplied(b, c.wh, end, 10*time.Minute)
	rate := float64(debeziumChanges) / time.Since(started).Seconds()
	rd.stop(b)
	return rate
}

// mirrorDigest is the md5 of dw_orders' rows in key order, each with
// whether it is flagged deleted.
func mirrorDigest(b *testing.B, wh *pgxpool.Pool) string {
	b.Helper()
	var d string
	if err := wh.QueryRow(context.Background(), `SELECT md5(string_agg(concat_ws('|', id, customer_id, amount::numeric(12,2), status, note, placed_at,
		deleted_at IS NULL), ',' ORDER BY id)) FROM dw_orders`).Scan(&d); err != nil {
		b.Fatal(err)
	}
	return d
}

// debeziumRecords reads the raw change rows of source shop in source
// order and writes each as the Debezium PostgreSQL connector does with the
// JSON converter and schemas: the key {id}, the envelope with before,
// after, source (lsn, sequence) and op.
func debeziumRecords(b *testing.B, wh *pgxpool.Pool) []*kgo.Record {
	b.Helper()
	ctx := context.Background()
	rows, err := wh.Query(ctx, `
SELECT op, (payload->>'id')::bigint, coalesce((payload->>'customer_id')::bigint, 0), coalesce(((payload->>'amount')::numeric * 100)::bigint, 0),
       coalesce(payload->>'status', ''), coalesce(payload->>'note', ''),
       coalesce(to_char((payload->>'placed_at')::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), ''),
       commit_lsn::text, extract(epoch FROM event_time) * 1000
FROM raw.shop ORDER BY commit_lsn, split_part(event_id, '/', 3)::int`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var (
		recs              []*kgo.Record
		lsn, txn, updates int64
		lastCommit        string
	)
	for rows.Next() {
		var (
			op, status, note, placed, commit string
			id, customer, cents              int64
			tsMS                             float64
		)
		if err := rows.Scan(&op, &id, &customer, &cents, &status, &note, &placed, &commit, &tsMS); err != nil {
			b.Fatal(err)
		}
		if commit != lastCommit {
			lastCommit, txn = commit, lsn
		}
		lsn++
		row := map[string]any{"id": id, "customer_id": customer, "amount": debeziumtest.DecimalBase64(cents),
			"status": status, "note": note, "placed_at": placed}
		var before, after any
		code := "c"
		switch op {
		case "update":
			code, after = "u", row
			if updates++; updates%2 == 0 {
				row["note"] = "__debezium_unavailable_value"
			}
		case "delete":
			code, before = "d", map[string]any{"id": id, "customer_id": nil, "amount": nil, "status": nil, "note": nil, "placed_at": nil}
		default:
			after = row
		}
		payload := map[string]any{"before": before, "after": after, "op": code, "ts_ms": int64(tsMS),
			"source": map[string]any{"version": "2.5.4.Final", "connector": "postgresql", "name": "bench", "ts_ms": int64(tsMS),
				"snapshot": "false", "db": "shop", "schema": "public", "table": "orders", "txId": txn,
				"lsn": lsn, "sequence": fmt.Sprintf(`["%d","%d"]`, txn, lsn)}}
		value, err := json.Marshal(map[string]any{"schema": json.RawMessage(ordersEnvelopeSchema), "payload": payload})
		if err != nil {
			b.Fatal(err)
		}
		key := []byte(`{"schema":{"type":"struct","optional":false,"name":"bench.public.orders.Key","fields":[{"type":"int64","optional":false,"field":"id"}]},"payload":{"id":` +
			strconv.FormatInt(id, 10) + `}}`)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Key: key, Value: value})
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if len(recs) != debeziumChanges {
		b.Fatalf("%d change rows, want %d", len(recs), debeziumChanges)
	}
	return recs
}

// ordersRowSchema is the Connect schema of an orders row; %s is its field.
const ordersRowSchema = `{"type":"struct","optional":true,"name":"bench.public.orders.Value","field":"%s","fields":[
{"type":"int64","optional":false,"field":"id"},
{"type":"int64","optional":false,"field":"customer_id"},
{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},
{"type":"string","optional":false,"field":"status"},
{"type":"string","optional":false,"field":"note"},
{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","field":"placed_at"}]}`

// ordersEnvelopeSchema is the Connect schema of an orders change event.
var ordersEnvelopeSchema = `{"type":"struct","optional":false,"name":"bench.public.orders.Envelope","fields":[` +
	fmt.Sprintf(ordersRowSchema, "before") + "," + fmt.Sprintf(ordersRowSchema, "after") + `,
{"type":"struct","optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source","fields":[
{"type":"string","optional":false,"field":"connector"},{"type":"int64","optional":false,"field":"ts_ms"},
{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"lsn"}]},
{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]}`

// measureDebezium drains the topic with one ingester of a Debezium source
// into a fresh warehouse database, checks that its mirror equals the CDC
// reader's, and returns the changes applied per second, from the first
// committed batch to the last.
func measureDebezium(b *testing.B, e *env, n, round int, want string) float64 {
	b.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabaseOn(b, e.srv)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	wh := pgtest.Pool(b, dsn)
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: warn}
kafka: {brokers: [%q], group: bench-debezium-%d}
%s
sources:
  orders:
    kafka: {topics: [%s]}
    format: debezium
    mirror: {table: dw_orders}
`, dsn, e.kc.ListenAddrs()[0], round, batchRowsYAML(), topic)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	e.settle(b)
	waitNoAutovacuum(b, e.srv)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	firstAt, firstRows := awaitWritten(b, []*prometheus.Registry{reg}, n, done, nil)
	elapsed := time.Since(firstAt)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if got := mirrorDigest(b, wh); got != want {
		b.Fatalf("the Debezium mirror (md5 %s) differs from the CDC reader's (md5 %s)", got, want)
	}
	return float64(int64(n)-firstRows) / elapsed.Seconds()
}
