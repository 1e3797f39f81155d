package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// itemChange is a Debezium change of a table items (id, qty), with
// schemas, qty of Connect type qtyType: an insert or update of id to qty at
// LSN lsn.
func itemChange(topic string, id int64, qty any, qtyType string, lsn int64) *kgo.Record {
	row := func(field string) string {
		return fmt.Sprintf(`{"type":"struct","optional":true,"name":"dbs.public.items.Value","field":%q,"fields":[
{"type":"int32","optional":false,"field":"id"},{"type":%q,"optional":true,"field":"qty"}]}`, field, qtyType)
	}
	schema := `{"type":"struct","optional":false,"name":"dbs.public.items.Envelope","fields":[` + row("before") + "," + row("after") + `,
{"type":"struct","optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source","fields":[
{"type":"string","optional":false,"field":"connector"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"int64","optional":true,"field":"lsn"}]},
{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]}`
	at := testNow.Add(-time.Hour).Add(time.Duration(lsn) * time.Millisecond).UnixMilli()
	value := fmt.Sprintf(`{"schema":%s,"payload":{"before":null,"after":{"id":%d,"qty":%v},
"source":{"connector":"postgresql","ts_ms":%d,"lsn":%d,"db":"shop","schema":"public","table":"items"},"op":"u","ts_ms":%d}}`,
		schema, id, qty, at, lsn, at)
	key := fmt.Sprintf(`{"schema":{"type":"struct","optional":false,"name":"dbs.public.items.Key","fields":[{"type":"int32","optional":false,"field":"id"}]},"payload":{"id":%d}}`, id)
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// startItems runs a Debezium source of items whose mirror holds ids 1
// and 2, loaded from two changes with schemas (qty int32).
func startItems(t *testing.T) (*bundle, *produced, *running) {
	t.Helper()
	b := setup(t, 1)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, []*kgo.Record{itemChange(b.topic, 1, 5, "int32", 100), itemChange(b.topic, 2, 6, "int32", 110)})
	r := b.startDebezium(t, 100)
	b.waitStored(t, p.end, time.Minute)
	return b, p, r
}

// TestDebeziumColumnWidens: a column the source widens (int32 to int64)
// is widened in the mirror, so a value that only the wider type holds
// loads; a change of type the mirror's column cannot hold and that is the
// operator's to make (an integer column for decimals) stalls the source,
// naming the ALTER to run, and it resumes once run.
func TestDebeziumColumnWidens(t *testing.T) {
	ctx := context.Background()
	b, p, r := startItems(t)
	typeOf := func() string {
		t.Helper()
		return pgtest.Rows(t, b.pool, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = 'dw.customers'::regclass AND attname = 'qty'`)[0]
	}
	if got := typeOf(); got != "integer" {
		t.Fatalf("qty created as %s, want integer", got)
	}

	// int64 at the source: 5,000,000,000 loads in a widened column.
	b.produce(t, p, []*kgo.Record{itemChange(b.topic, 1, 5_000_000_000, "int64", 120)})
	b.waitStored(t, p.end, time.Minute)
	if got := typeOf(); got != "bigint" {
		t.Errorf("qty is %s after the source widened it, want bigint", got)
	}
	mirrorRows := func() string {
		t.Helper()
		// Not prepared: the column's type changes under the test.
		return strings.Join(pgtest.Lines(t, b.pool, `SELECT id, qty FROM dw.customers ORDER BY id`, pgx.QueryExecModeSimpleProtocol), ",")
	}
	if got := mirrorRows(); got != "1 | 5000000000,2 | 6" {
		t.Errorf("mirror %s, want 1 | 5000000000,2 | 6", got)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}

	// An integer column for floats is the operator's to alter.
	b.produce(t, p, []*kgo.Record{itemChange(b.topic, 2, 6.5, "float64", 130)})
	waitfor.Until(t, "the source to stall naming the ALTER", func() bool {
		st := r.in.Stalls()
		return len(st) == 1 && strings.Contains(st[0].Fix, `ALTER TABLE "dw"."customers" ALTER COLUMN "qty" TYPE double precision`)
	})
	if _, err := b.pool.Exec(ctx, `ALTER TABLE dw.customers ALTER COLUMN qty TYPE double precision`); err != nil {
		t.Fatal(err)
	}
	b.waitStored(t, p.end, time.Minute)
	if got := mirrorRows(); got != "1 | 5e+09,2 | 6.5" {
		t.Errorf("mirror %s, want 1 | 5e+09,2 | 6.5", got)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestDebeziumReplay: changes the mirror refused (a CHECK constraint) are
// dead letters that dead-letters replay loads once the mirror is fixed: a
// change row each, and the change applied to the mirror unless a later
// change of its row is there (positions fence it, whatever order they are
// replayed in); a second replay finds nothing.
func TestDebeziumReplay(t *testing.T) {
	ctx := context.Background()
	b, p, r := startItems(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`ALTER TABLE dw.customers ADD CONSTRAINT no_negative CHECK (qty >= 0)`)
	// The refused changes, sent after a later one of their row's (id 1),
	// and alone (id 2).
	b.produce(t, p, []*kgo.Record{itemChange(b.topic, 1, 7, "int32", 130), itemChange(b.topic, 1, -1, "int32", 120),
		itemChange(b.topic, 2, -2, "int32", 140)})
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	mirrorRows := func() string {
		t.Helper()
		return strings.Join(pgtest.Lines(t, b.pool, `SELECT id, qty, source_position FROM dw.customers ORDER BY id`), ",")
	}
	if got := mirrorRows(); got != "1 | 7 | [1 130 130],2 | 6 | [1 110 110]" {
		t.Errorf("mirror %s before the replay", got)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters WHERE reason = 'rejected'`); n != 2 {
		t.Fatalf("%d rejected dead letters, want 2", n)
	}

	exec(`ALTER TABLE dw.customers DROP CONSTRAINT no_negative`)
	cfg := b.debeziumConfig(t, 100)
	rep, err := kafka.Replay(ctx, pgtest.Conn(t, b.dsn), kafka.ConfigFrom(cfg), kafka.ReplayOptions{Source: "customers", Now: b.clock.Now})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if rep.Read != 2 || rep.Loaded != 2 || len(rep.Failing) != 0 {
		t.Errorf("replay read %d, loaded %d, failing %v; want 2, 2, none", rep.Read, rep.Loaded, rep.Failing)
	}
	if got := mirrorRows(); got != "1 | 7 | [1 130 130],2 | -2 | [1 140 140]" {
		t.Errorf("mirror %s after the replay, want id 1 at 7 (position 130) and id 2 at -2 (140): id 1's later change fences the replayed one", got)
	}
	if got := strings.Join(pgtest.Rows(t, b.pool, `SELECT count(*), count(DISTINCT event_id) FROM raw.customers`), ""); got != "5 5" {
		t.Errorf("raw change rows (all, distinct) %s, want 5 5", got)
	}
	rep, err = kafka.Replay(ctx, pgtest.Conn(t, b.dsn), kafka.ConfigFrom(cfg), kafka.ReplayOptions{Source: "customers", Now: b.clock.Now})
	if err != nil || rep.Read != 0 {
		t.Errorf("a second replay read %d (%v), want 0", rep.Read, err)
	}
}

// TestDebeziumWrongTable: a change of another table on a Debezium
// source's topic (public.other_table deleting a key the mirror has) is a
// dead letter wrong_table and leaves the mirror as it was: with
// mirror.source_table naming the table (in any schema, or exactly), and
// without, where the source mirrors the table of its changes.
func TestDebeziumWrongTable(t *testing.T) {
	for _, tt := range []struct{ name, extra string }{
		{"learned", ""},
		{"configured", "      source_table: customers"},
		{"configured with its schema", "      source_table: public.customers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, 1)
			s := debeziumtest.New(debeziumtest.PostgreSQL, true, b.topic, 1, testNow.Add(-time.Hour))
			s.Insert(1, debeziumtest.Values{Name: "a", Bio: "b", Balance: 100})
			s.Insert(2, debeziumtest.Values{Name: "c", Bio: "d", Balance: 200})
			s.Commit()
			before := len(s.Records)
			kept := *s.Want[1]
			s.Delete(1)
			s.Commit()
			// The delete is other_table's: the mirror keeps id 1, and the
			// stream holds one change row fewer (its tombstone is skipped).
			for _, r := range s.Records[before:] {
				r.Value = []byte(strings.Replace(string(r.Value), `"table":"customers"`, `"table":"other_table"`, 1))
			}
			s.Want[1], s.Changes = &kept, s.Changes-1
			s.Update(2, debeziumtest.Values{Name: "c2", Bio: "d", Balance: 300})
			s.Commit()
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, s.Records)
			cfgText := b.debeziumYAML(100)
			if tt.extra != "" {
				cfgText = strings.Replace(cfgText, "    mirror: {table: dw.customers}\n", "    mirror:\n      table: dw.customers\n"+tt.extra+"\n", 1)
			}
			cfg, err := config.Parse("test.yaml", []byte(cfgText), func(string) (string, bool) { return "", false })
			if err != nil {
				t.Fatal(err)
			}
			in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Now: b.clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			r := b.run(t, in)
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
			if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.customers`); n != int64(s.Changes) {
				t.Errorf("%d change rows, want %d", n, s.Changes)
			}
			if got := strings.Join(pgtest.Lines(t, b.pool, `SELECT reason, detail LIKE 'a change of public.other_table;%' FROM tidemark.dead_letters`), ","); got != "wrong_table | true" {
				t.Errorf("dead letters %s, want one wrong_table naming public.other_table", got)
			}
		})
	}
}

// TestDebeziumCheckedInChunks: when the mirror refuses changes of a large
// batch, the batch is checked in chunks of changes under a savepoint
// each, and only the chunks holding a refused change one change at a
// time: the refused changes (the first, one at a chunk's end, the last)
// are the dead letters, every other change is stored and applied, and
// the check takes a few hundred subtransactions (each takes an xid), not
// one or more per change: with one per change, a batch of thousands
// outlasted warehouse.write_timeout and was never written.
func TestDebeziumCheckedInChunks(t *testing.T) {
	ctx := context.Background()
	b, p, r := startItems(t)
	r.stop(t)
	if _, err := b.pool.Exec(ctx, `ALTER TABLE dw.customers ADD CONSTRAINT no_negative CHECK (qty >= 0)`); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	bad := map[int64]bool{3: true, 64: true, n: true}
	var recs []*kgo.Record
	for id := int64(3); id <= n; id++ {
		qty := id
		if bad[id] {
			qty = -id
		}
		recs = append(recs, itemChange(b.topic, id, qty, "int32", 200+id))
	}
	b.produce(t, p, recs)
	var before int64
	if err := b.pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	// One batch of every change: batch_max_age well past their arrival.
	yaml := strings.Replace(b.debeziumYAML(len(recs)), "batch_max_age: 50ms", "batch_max_age: 20s", 1)
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Now: b.clock.Now,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	r = b.run(t, in)
	b.waitStored(t, p.end, 2*time.Minute)
	r.stop(t)
	var after int64
	if err := b.pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&after); err != nil {
		t.Fatal(err)
	}

	if got := pgtest.Rows(t, b.pool, `SELECT string_agg(payload->'after'->>'id', ',' ORDER BY (payload->'after'->>'id')::int)
		FROM tidemark.dead_letters AS d, LATERAL (SELECT convert_from(d.record_value, 'UTF8')::jsonb->'payload' AS payload) AS v
		WHERE reason = 'rejected'`); strings.Join(got, "") != fmt.Sprintf("3,64,%d", n) {
		t.Errorf("rejected dead letters of ids %v, want 3, 64 and %d", got, n)
	}
	if got := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM dw.customers WHERE qty = id`); got != n-2-3 {
		t.Errorf("%d mirror rows changed, want %d", got, n-2-3)
	}
	if got := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.customers`); got != 2+n-2-3 {
		t.Errorf("%d change rows, want %d", got, 2+n-2-3)
	}
	t.Logf("%d xids for %d changes", after-before, len(recs))
	if used := after - before; used > n/4 {
		t.Errorf("the batch took %d xids for %d changes, want at most %d: checked one change at a time", used, n-2, n/4)
	}
}
