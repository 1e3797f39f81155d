package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
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
//	    the schema, offsets;
//	(c) the same as (b) with the AvroConverter: key and value in the
//	    Confluent wire format, their schemas in a schema registry.
//
// The ingester of (b) and (c) may use as much memory as the CDC reader
// does by default (twice cdc.max_buffer_bytes): ingest.memory_max_bytes
// is 128 MiB, TIDEMARK_BENCH_DEBEZIUM_MEMORY ("default" for the
// ingester's default).
//
// Each round has its own slot (made before the workload) and warehouse
// databases; rounds alternate which of (a) and (b), (c) goes first, and
// the mirrors must end equal. Reported: the medians of the rounds' (b)/(a)
// and (c)/(a).
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
		changes := readDebeziumChanges(b, wh)
		want := mirrorDigest(b, wh)
		g := srtest.New(b)
		variants := []*dbzVariant{
			{name: "JSON", kc: newCluster(b, 1), recs: jsonRecords(b, changes)},
			{name: "Avro", kc: newCluster(b, 1), recs: avroRecords(b, g, changes), registry: g.URL()},
		}
		for _, v := range variants {
			e.kc = v.kc
			e.produce(b, v.recs)
		}
		for round := range rounds {
			measureVariants := func(order []*dbzVariant) {
				for _, v := range order {
					v.rates = append(v.rates, measureDebezium(b, e, v, round, want))
				}
			}
			switch {
			case round == 0:
				measureVariants(variants)
			case round%2 == 1:
				measureVariants([]*dbzVariant{variants[1], variants[0]})
				cdcRates = append(cdcRates, readers[round].measure(b, e, end))
			default:
				cdcRates = append(cdcRates, readers[round].measure(b, e, end))
				measureVariants(variants)
			}
			for _, v := range variants {
				v.ratios = append(v.ratios, v.rates[round]/cdcRates[round])
			}
			b.Logf("round %d: (a) CDC apply %.0f changes/s, (b) Debezium JSON apply %.0f changes/s, (b)/(a) %.2f, (c) Debezium Avro apply %.0f changes/s, (c)/(a) %.2f",
				round+1, cdcRates[round], variants[0].rates[round], variants[0].ratios[round], variants[1].rates[round], variants[1].ratios[round])
		}
		b.ReportMetric(medianOf(variants[0].ratios), "debezium/cdc")
		b.ReportMetric(medianOf(variants[1].ratios), "debezium_avro/cdc")
		b.ReportMetric(medianOf(cdcRates), "cdc_changes/s")
		b.ReportMetric(medianOf(variants[0].rates), "debezium_changes/s")
		b.ReportMetric(medianOf(variants[1].rates), "debezium_avro_changes/s")
		b.Logf("Debezium apply: median (b)/(a) of %d rounds %.2f, (c)/(a) %.2f (target >= %.1f)",
			rounds, medianOf(variants[0].ratios), medianOf(variants[1].ratios), debeziumTarget)
	}
}

// dbzVariant is one way the Debezium changes are sent: its records on a
// cluster of their own, the registry they need ("" for none), and the
// rates and ratios measured.
type dbzVariant struct {
	name          string
	kc            *kfake.Cluster
	recs          []*kgo.Record
	registry      string
	rates, ratios []float64
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
	prof := startProfile(b, e.srv, dbName(b, c.cfg.Warehouse.DSN))
	stopGo := startGoProfile(b, "debezium_cdc_apply")
	started := time.Now()
	rd := startReader(b, c.cfg, c.wh)
	rd.waitApplied(b, c.wh, end, 10*time.Minute)
	rate := float64(debeziumChanges) / time.Since(started).Seconds()
	stopGo()
	prof.report(b, "(a) CDC apply")
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

// dbzChange is a change of the workload as the connector sends it: op
// code (c, u, d), the row's values (note "" for the unchanged-TOAST
// placeholder), and its source transaction, LSN and commit time.
type dbzChange struct {
	code                 string
	id, customer, cents  int64
	status, note, placed string
	txn, lsn, tsMS       int64
}

// readDebeziumChanges reads the raw change rows of source shop in source
// order as the changes the Debezium connector sends of them: every other
// update has note as the unchanged-TOAST placeholder.
func readDebeziumChanges(b *testing.B, wh *pgxpool.Pool) []dbzChange {
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
		out               []dbzChange
		lsn, txn, updates int64
		lastCommit        string
	)
	for rows.Next() {
		var (
			c          dbzChange
			op, commit string
			tsMS       float64
		)
		if err := rows.Scan(&op, &c.id, &c.customer, &c.cents, &c.status, &c.note, &c.placed, &commit, &tsMS); err != nil {
			b.Fatal(err)
		}
		if commit != lastCommit {
			lastCommit, txn = commit, lsn
		}
		lsn++
		c.txn, c.lsn, c.tsMS = txn, lsn, int64(tsMS)
		switch op {
		case "update":
			c.code = "u"
			if updates++; updates%2 == 0 {
				c.note = unavailable
			}
		case "delete":
			c.code = "d"
		default:
			c.code = "c"
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if len(out) != debeziumChanges {
		b.Fatalf("%d change rows, want %d", len(out), debeziumChanges)
	}
	return out
}

// unavailable is Debezium's placeholder of an unchanged TOASTed value.
const unavailable = "__debezium_unavailable_value"

// jsonRecords writes each change as the Debezium PostgreSQL connector does
// with the JSON converter and schemas: the key {id}, the envelope with
// before, after, source (lsn, sequence) and op.
func jsonRecords(b *testing.B, changes []dbzChange) []*kgo.Record {
	b.Helper()
	recs := make([]*kgo.Record, 0, len(changes))
	for _, c := range changes {
		row := map[string]any{"id": c.id, "customer_id": c.customer, "amount": debeziumtest.DecimalBase64(c.cents),
			"status": c.status, "note": c.note, "placed_at": c.placed}
		var before, after any
		switch c.code {
		case "d":
			before = map[string]any{"id": c.id, "customer_id": nil, "amount": nil, "status": nil, "note": nil, "placed_at": nil}
		default:
			after = row
		}
		payload := map[string]any{"before": before, "after": after, "op": c.code, "ts_ms": c.tsMS,
			"source": map[string]any{"version": "2.5.4.Final", "connector": "postgresql", "name": "bench", "ts_ms": c.tsMS,
				"snapshot": "false", "db": "shop", "schema": "public", "table": "orders", "txId": c.txn,
				"lsn": c.lsn, "sequence": fmt.Sprintf(`["%d","%d"]`, c.txn, c.lsn)}}
		body, err := json.Marshal(payload)
		if err != nil {
			b.Fatal(err)
		}
		// The converter writes the schema first.
		value := append(append(append([]byte(`{"schema":`), ordersEnvelopeSchemaCompact...), `,"payload":`...), body...)
		value = append(value, '}')
		key := []byte(`{"schema":{"type":"struct","optional":false,"name":"bench.public.orders.Key","fields":[{"type":"int64","optional":false,"field":"id"}]},"payload":{"id":` +
			strconv.FormatInt(c.id, 10) + `}}`)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Key: key, Value: value})
	}
	return recs
}

// avroRecords writes each change as the Debezium PostgreSQL connector does
// with the AvroConverter: key and value in the Confluent wire format,
// their schemas (ordersAvroKey, ordersAvroEnvelope) registered in g.
func avroRecords(b *testing.B, g *srtest.Registry, changes []dbzChange) []*kgo.Record {
	b.Helper()
	keyOf := srtest.AvroEncoderOf(b, g.Register(topic+"-key", sr.Schema{Schema: ordersAvroKey}), ordersAvroKey, avroOrderKey{})
	valueOf := srtest.AvroEncoderOf(b, g.Register(topic+"-value", sr.Schema{Schema: ordersAvroEnvelope}), ordersAvroEnvelope, avroOrderEnvelope{})
	recs := make([]*kgo.Record, 0, len(changes))
	for _, c := range changes {
		amount, err := base64.StdEncoding.DecodeString(debeziumtest.DecimalBase64(c.cents))
		if err != nil {
			b.Fatal(err)
		}
		ev := avroOrderEnvelope{Op: c.code, TsMs: &c.tsMS, Source: debeziumtest.AvroPGSource{Version: "2.5.4.Final", Connector: "postgresql", Name: "bench",
			TsMs: c.tsMS, Snapshot: ptrTo("false"), DB: "shop", Sequence: ptrTo(fmt.Sprintf(`["%d","%d"]`, c.txn, c.lsn)), Schema: "public",
			Table: "orders", TxID: ptrTo(c.txn), LSN: ptrTo(c.lsn)}}
		if c.code == "d" {
			ev.Before = &avroOrder{ID: c.id}
		} else {
			ev.After = &avroOrder{ID: c.id, CustomerID: ptrTo(c.customer), Amount: amount, Status: ptrTo(c.status), Note: ptrTo(c.note), PlacedAt: ptrTo(c.placed)}
		}
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Key: keyOf(avroOrderKey{ID: c.id}), Value: valueOf(ev)})
	}
	return recs
}

func ptrTo[T any](v T) *T { return &v }

// The Avro schemas the AvroConverter registers for the orders table's
// change events: Connect's annotations, optional columns as ["null", T].
const (
	ordersAvroKey = `{"type":"record","name":"Key","namespace":"bench.public.orders","fields":[{"name":"id","type":"long"}],
"connect.name":"bench.public.orders.Key"}`
	ordersAvroEnvelope = `{"type":"record","name":"Envelope","namespace":"bench.public.orders","fields":[
{"name":"before","type":["null",{"type":"record","name":"Value","fields":[
  {"name":"id","type":"long"},
  {"name":"customer_id","type":["null","long"],"default":null},
  {"name":"amount","type":["null",{"type":"bytes","scale":2,"precision":12,"connect.version":1,
    "connect.parameters":{"scale":"2","connect.decimal.precision":"12"},
    "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
  {"name":"status","type":["null","string"],"default":null},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"placed_at","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.time.ZonedTimestamp"}],"default":null}],
  "connect.name":"bench.public.orders.Value"}],"default":null},
{"name":"after","type":["null","Value"],"default":null},
{"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
  {"name":"version","type":"string"},{"name":"connector","type":"string"},{"name":"name","type":"string"},
  {"name":"ts_ms","type":"long"},
  {"name":"snapshot","type":[{"type":"string","connect.version":1,"connect.parameters":{"allowed":"true,last,false,incremental"},
    "connect.default":"false","connect.name":"io.debezium.data.Enum"},"null"],"default":"false"},
  {"name":"db","type":"string"},{"name":"sequence","type":["null","string"],"default":null},
  {"name":"schema","type":"string"},{"name":"table","type":"string"},
  {"name":"txId","type":["null","long"],"default":null},{"name":"lsn","type":["null","long"],"default":null},
  {"name":"xmin","type":["null","long"],"default":null}],
  "connect.name":"io.debezium.connector.postgresql.Source"}},
{"name":"op","type":"string"},
{"name":"ts_ms","type":["null","long"],"default":null}],
"connect.version":1,"connect.name":"bench.public.orders.Envelope"}`
)

type avroOrderKey struct {
	ID int64 `avro:"id"`
}

type avroOrder struct {
	ID         int64   `avro:"id"`
	CustomerID *int64  `avro:"customer_id"`
	Amount     []byte  `avro:"amount"`
	Status     *string `avro:"status"`
	Note       *string `avro:"note"`
	PlacedAt   *string `avro:"placed_at"`
}

type avroOrderEnvelope struct {
	Before *avroOrder                `avro:"before"`
	After  *avroOrder                `avro:"after"`
	Source debeziumtest.AvroPGSource `avro:"source"`
	Op     string                    `avro:"op"`
	TsMs   *int64                    `avro:"ts_ms"`
}

// ordersRowSchema is the Connect schema of an orders row; %s is its field.
const ordersRowSchema = `{"type":"struct","optional":true,"name":"bench.public.orders.Value","field":"%s","fields":[
{"type":"int64","optional":false,"field":"id"},
{"type":"int64","optional":false,"field":"customer_id"},
{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},
{"type":"string","optional":false,"field":"status"},
{"type":"string","optional":false,"field":"note"},
{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","field":"placed_at"}]}`

// ordersEnvelopeSchemaCompact is ordersEnvelopeSchema as the converter
// writes it, without white space.
var ordersEnvelopeSchemaCompact = func() []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(ordersEnvelopeSchema)); err != nil {
		panic(err)
	}
	return b.Bytes()
}()

// ordersEnvelopeSchema is the Connect schema of an orders change event.
var ordersEnvelopeSchema = `{"type":"struct","optional":false,"name":"bench.public.orders.Envelope","fields":[` +
	fmt.Sprintf(ordersRowSchema, "before") + "," + fmt.Sprintf(ordersRowSchema, "after") + `,
{"type":"struct","optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source","fields":[
{"type":"string","optional":false,"field":"connector"},{"type":"int64","optional":false,"field":"ts_ms"},
{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"lsn"}]},
{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]}`

// measureDebezium drains the topic of variant v with one ingester of a
// Debezium source into a fresh warehouse database, checks that its mirror
// equals the CDC reader's, and returns the changes applied per second,
// from the first committed batch to the last.
func measureDebezium(b *testing.B, e *env, v *dbzVariant, round int, want string) float64 {
	b.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabaseOn(b, e.srv)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	wh := pgtest.Pool(b, dsn)
	n := len(v.recs)
	registry := ""
	if v.registry != "" {
		registry = fmt.Sprintf("schema_registry: {url: %q}", v.registry)
	}
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: warn}
kafka: {brokers: [%q], group: bench-debezium-%s-%d}
%s
%s
sources:
  orders:
    kafka: {topics: [%s]}
    format: debezium
    mirror: {table: dw_orders}
`, dsn, v.kc.ListenAddrs()[0], v.name, round, debeziumIngestYAML(), registry, topic)), func(string) (string, bool) { return "", false })
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
	prof := startProfile(b, e.srv, dbName(b, dsn))
	stopGo := startGoProfile(b, "debezium_"+v.name)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	firstAt, firstRows := awaitWritten(b, []*prometheus.Registry{reg}, n, done, nil)
	elapsed := time.Since(firstAt)
	stopGo()
	prof.report(b, "Debezium "+v.name+" apply")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	batches, records, writing := histogramTotals(b, reg, "tidemark_ingest_batch_records", "tidemark_ingest_commit_seconds")
	b.Logf("(%s) %d batches of %.0f records on average; their writes took %.1fs of the %.1fs", v.name, batches, records/float64(max(batches, 1)), writing, elapsed.Seconds())
	if got := mirrorDigest(b, wh); got != want {
		b.Fatalf("the Debezium %s mirror (md5 %s) differs from the CDC reader's (md5 %s)", v.name, got, want)
	}
	return float64(int64(n)-firstRows) / elapsed.Seconds()
}

// debeziumIngestYAML is the ingest settings of (b) and (c): the memory of
// TIDEMARK_BENCH_DEBEZIUM_MEMORY (128MiB, the CDC reader's default
// memory, unless it says "default"), and TIDEMARK_BENCH_BATCH_ROWS.
func debeziumIngestYAML() string {
	var set []string
	mem := os.Getenv("TIDEMARK_BENCH_DEBEZIUM_MEMORY")
	if mem == "" {
		mem = "128MiB"
	}
	if mem != "default" {
		set = append(set, "memory_max_bytes: "+mem)
	}
	if n := envInt("TIDEMARK_BENCH_BATCH_ROWS", 0); n > 0 {
		set = append(set, fmt.Sprintf("batch_max_rows: %d", n))
	}
	if len(set) == 0 {
		return ""
	}
	return "ingest: {" + strings.Join(set, ", ") + "}"
}

// histogramTotals returns the count and sum of the histogram named rows
// in reg, and the sum of the one named seconds.
func histogramTotals(b *testing.B, reg *prometheus.Registry, rows, seconds string) (count uint64, sum, secs float64) {
	b.Helper()
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch h := m.GetHistogram(); f.GetName() {
			case rows:
				count, sum = count+h.GetSampleCount(), sum+h.GetSampleSum()
			case seconds:
				secs += h.GetSampleSum()
			}
		}
	}
	return count, sum, secs
}
