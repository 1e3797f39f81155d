package raw_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tableEnv is a migrated warehouse with raw.app_events, partitioned by day.
type tableEnv struct {
	conn  *pgx.Conn
	dsn   string
	table *raw.Table
}

func newTableEnv(t *testing.T) *tableEnv {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	e := &tableEnv{conn: conn, dsn: dsn, table: raw.NewTable("app_events", config.PartitionDay)}
	if err := e.table.Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return e
}

// count runs a query returning one number.
func (e *tableEnv) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	if err := e.conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// strings runs a query returning one text column.
func (e *tableEnv) strings(t *testing.T, sql string) []string {
	t.Helper()
	rows, err := e.conn.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRawPartitioningMustMatch: a raw table created with daily partitions
// cannot be reused with monthly ones; Ensure says which key to fix.
func TestRawPartitioningMustMatch(t *testing.T) {
	h := newTableEnv(t)
	ctx := context.Background()
	if err := h.table.EnsurePartitions(ctx, h.conn, []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	err := raw.NewTable("app_events", config.PartitionMonth).Ensure(ctx, h.conn)
	if !errors.Is(err, raw.ErrPartitioningChanged) || !strings.Contains(err.Error(), "sources.app_events.raw_partition") {
		t.Fatalf("Ensure with another granularity = %v", err)
	}
	// The same granularity is fine, and learns the existing partitions.
	same := raw.NewTable("app_events", config.PartitionDay)
	if err := same.Ensure(ctx, h.conn); err != nil {
		t.Fatal(err)
	}
	if missing := same.Missing([]time.Time{time.Date(2026, 10, 5, 13, 0, 0, 0, time.UTC)}); len(missing) != 0 {
		t.Errorf("existing partition not known: %v", missing)
	}
}

// TestRawTableIndexUpgrade: a raw table created with the load_xid b-tree
// (and a partition that inherited it) gets the BRIN index on ingested_at
// and loses the b-tree on its next Ensure, rows untouched; a second Ensure
// changes nothing.
func TestRawTableIndexUpgrade(t *testing.T) {
	h := newTableEnv(t)
	ctx := context.Background()
	day := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	for _, sql := range []string{
		`DROP INDEX raw.app_events_ingested_at`,
		`CREATE INDEX app_events_load_xid ON raw.app_events (load_xid)`,
	} {
		if _, err := h.conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.table.EnsurePartitions(ctx, h.conn, []time.Time{day}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.conn.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
		SELECT 'e' || g, $1::timestamptz + g * interval '1 s', now(), '{}' FROM generate_series(1, 100) g`, day); err != nil {
		t.Fatal(err)
	}
	indexes := `SELECT c.relname || ' ' || am.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_am am ON am.oid = c.relam WHERE NOT i.indisprimary
		AND i.indrelid IN ('raw.app_events'::regclass, 'raw.app_events_p20261005'::regclass) ORDER BY 1`
	before := h.strings(t, indexes)
	if len(before) != 2 || !strings.HasPrefix(before[0], "app_events_load_xid btree") {
		t.Fatalf("legacy indexes not set up: %v", before)
	}
	for i := 0; i < 2; i++ {
		if err := raw.NewTable("app_events", config.PartitionDay).Ensure(ctx, h.conn); err != nil {
			t.Fatal(err)
		}
		want := []string{"app_events_ingested_at brin", "app_events_p20261005_ingested_at_idx brin"}
		if got := h.strings(t, indexes); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("Ensure %d: indexes %v, want %v", i+1, got, want)
		}
	}
	if n := h.count(t, "SELECT count(*) FROM raw.app_events"); n != 100 {
		t.Errorf("raw rows %d, want 100", n)
	}
}

// TestRawKeyCollation: raw tables of both kinds, and their partitions,
// compare event_id byte by byte (COLLATE "C"), their primary key included;
// a table created before with the database's collation is left as it is,
// keeps taking partitions, and converts with the runbook's
// statement, rows kept.
func TestRawKeyCollation(t *testing.T) {
	h := newTableEnv(t)
	ctx := context.Background()
	day := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	collations := func(source string) []string {
		t.Helper()
		return h.strings(t, fmt.Sprintf(`
SELECT c.relname || ' ' || co.collname || ' ' || ico.collname
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'event_id'
JOIN pg_collation co ON co.oid = a.attcollation
JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
JOIN pg_collation ico ON ico.oid = i.indcollation[0]
WHERE c.oid IN ('raw.%[1]s'::regclass, 'raw.%[1]s_p20261005'::regclass)
ORDER BY 1`, source))
	}
	for _, tc := range []struct {
		name  string
		table *raw.Table
	}{
		{"events", raw.NewTable("coll_events", config.PartitionDay)},
		{"changes", raw.NewChangeTable("coll_changes", config.PartitionDay)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.table.Ensure(ctx, h.conn); err != nil {
				t.Fatal(err)
			}
			if err := tc.table.EnsurePartitions(ctx, h.conn, []time.Time{day}); err != nil {
				t.Fatal(err)
			}
			src := tc.table.Source
			want := []string{src + " C C", src + "_p20261005 C C"}
			if got := collations(src); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("event_id and primary key collations %v, want %v", got, want)
			}
		})
	}
	// A table of an earlier version: event_id in the database's collation.
	if _, err := h.conn.Exec(ctx, `CREATE TABLE raw.coll_old (
    event_id text NOT NULL, event_time timestamptz NOT NULL, ingested_at timestamptz NOT NULL,
    payload jsonb NOT NULL, kafka_topic text, kafka_partition integer, kafka_offset bigint,
    load_xid xid8 NOT NULL DEFAULT pg_current_xact_id(), PRIMARY KEY (event_id, event_time)
) PARTITION BY RANGE (event_time)`); err != nil {
		t.Fatal(err)
	}
	old := raw.NewTable("coll_old", config.PartitionDay)
	if err := old.Ensure(ctx, h.conn); err != nil {
		t.Fatal(err)
	}
	if err := old.EnsurePartitions(ctx, h.conn, []time.Time{day}); err != nil {
		t.Fatal(err)
	}
	want := []string{"coll_old default default", "coll_old_p20261005 default default"}
	if got := collations("coll_old"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("an existing table's collations %v, want %v (left as they were)", got, want)
	}
	// The conversion the runbook gives, on a table with rows.
	if _, err := h.conn.Exec(ctx, `INSERT INTO raw.coll_old (event_id, event_time, ingested_at, payload)
		SELECT 'e' || g, $1::timestamptz + g * interval '1 s', now(), '{}' FROM generate_series(1, 100) g`, day); err != nil {
		t.Fatal(err)
	}
	if _, err := h.conn.Exec(ctx, `ALTER TABLE raw.coll_old ALTER COLUMN event_id TYPE text COLLATE "C"`); err != nil {
		t.Fatal(err)
	}
	want = []string{"coll_old C C", "coll_old_p20261005 C C"}
	if got := collations("coll_old"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("collations after the conversion %v, want %v", got, want)
	}
	if n := h.count(t, "SELECT count(*) FROM raw.coll_old"); n != 100 {
		t.Errorf("rows after the conversion %d, want 100", n)
	}
}

// TestRawKeyCollationNotice: Ensure says, once, when a raw table's
// event_id compares through a linguistic collation, and says nothing for a
// bytewise one (tidemark's own tables, or the default of a C database).
func TestRawKeyCollationNotice(t *testing.T) {
	h := newTableEnv(t)
	ctx := context.Background()
	var linguistic string
	if err := h.conn.QueryRow(ctx, `SELECT collname FROM pg_collation
		WHERE collname IN ('und-x-icu', 'en_US.utf8', 'C.utf8') ORDER BY collname DESC LIMIT 1`).Scan(&linguistic); err != nil {
		t.Fatalf("no linguistic collation on the test server: %v", err)
	}
	create := `CREATE TABLE raw.%s (
    event_id text %s NOT NULL, event_time timestamptz NOT NULL, ingested_at timestamptz NOT NULL,
    payload jsonb NOT NULL, kafka_topic text, kafka_partition integer, kafka_offset bigint,
    load_xid xid8 NOT NULL DEFAULT pg_current_xact_id(), PRIMARY KEY (event_id, event_time)
) PARTITION BY RANGE (event_time)`
	for _, tc := range []struct {
		name, collate string
		notice        bool
	}{
		{"tidemark_made", "", false}, // created by Ensure below
		{"db_default", `COLLATE "default"`, false},
		{"linguistic", "COLLATE " + pgx.Identifier{linguistic}.Sanitize(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.collate != "" {
				if _, err := h.conn.Exec(ctx, fmt.Sprintf(create, tc.name, tc.collate)); err != nil {
					t.Fatal(err)
				}
			}
			var log syncbuf.Buffer
			table := raw.NewTable(tc.name, config.PartitionDay)
			table.Log = slog.New(slog.NewTextHandler(&log, nil))
			for range 2 {
				if err := table.Ensure(ctx, h.conn); err != nil {
					t.Fatal(err)
				}
			}
			// The notice names the collation twice (with the runbook
			// section): count the lines.
			got := strings.Count(log.String(), `msg="raw table compares event_id through a linguistic collation`)
			if want := map[bool]int{false: 0, true: 1}[tc.notice]; got != want {
				t.Errorf("notices over two Ensures: %d, want %d; log:\n%s", got, want, log.String())
			}
		})
	}
}

// TestConcurrentPartitionCreation: several ingesters creating the same raw
// partitions at once all succeed (the per-source advisory lock).
func TestConcurrentPartitionCreation(t *testing.T) {
	h := newTableEnv(t)
	ctx := context.Background()
	var days []time.Time
	for d := 0; d < 20; d++ {
		days = append(days, time.Date(2026, 9, 10+d, 0, 0, 0, 0, time.UTC))
	}
	errs := make(chan error, 6)
	for i := 0; i < cap(errs); i++ {
		go func() {
			conn, err := pgx.Connect(ctx, h.dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			table := raw.NewTable("app_events", config.PartitionDay)
			errs <- table.EnsurePartitions(ctx, conn, table.Missing(days))
		}()
	}
	for i := 0; i < cap(errs); i++ {
		if err := <-errs; err != nil {
			t.Errorf("EnsurePartitions: %v", err)
		}
	}
	if n := h.count(t, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'raw.app_events'::regclass"); n != 20 {
		t.Errorf("%d partitions, want 20", n)
	}
}

// TestUnixHour: UnixHour names the same hour as truncating to the UTC
// hour, before and after the epoch and whatever the time's zone.
func TestUnixHour(t *testing.T) {
	oslo, err := time.LoadLocation("Europe/Oslo")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []time.Time{
		time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 5, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 10, 25, 2, 30, 0, 0, oslo), // the hour that repeats
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 0, 0, 1, time.UTC),
		time.Date(1969, 12, 31, 22, 59, 59, 0, time.UTC),
		time.Date(1900, 3, 1, 12, 0, 0, 0, time.UTC),
	} {
		want := tt.UTC().Truncate(time.Hour)
		if got := time.Unix(raw.UnixHour(tt)*3600, 0).UTC(); !got.Equal(want) {
			t.Errorf("UnixHour(%s) is the hour of %s, want %s", tt, got, want)
		}
	}
}

// TestSchemaReserved: the configuration refuses mirrors and aggregates in
// the raw tables' schema.
func TestSchemaReserved(t *testing.T) {
	if !config.ReservedSchema(raw.Schema) {
		t.Errorf("config.ReservedSchema(%q) is false: a mirror or aggregate could be written among the raw tables", raw.Schema)
	}
}

// TestColumnsAreTheTables: the tables Ensure creates have the columns
// writers fill, with the types the binary encoders write, and load_xid
// besides; a table of other types does not fit a binary COPY.
func TestColumnsAreTheTables(t *testing.T) {
	e := newTableEnv(t)
	ctx := context.Background()
	changes := raw.NewChangeTable("shop", config.PartitionMonth)
	if err := changes.Ensure(ctx, e.conn); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		table *raw.Table
		cols  raw.Columns
	}{{e.table, raw.EventColumns}, {changes, raw.ChangeColumns}} {
		if ok, err := tt.cols.BinaryCopyFits(ctx, e.conn, tt.table.Ident()); err != nil || !ok {
			t.Errorf("%s: the columns do not fit a binary COPY (%v)", tt.table.Ident(), err)
		}
		got := e.strings(t, fmt.Sprintf(`SELECT attname FROM pg_attribute WHERE attrelid = '%s'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, tt.table.Ident()))
		if want := append(tt.cols.Names(), "load_xid"); !slices.Equal(got, want) {
			t.Errorf("%s has the columns %q, want %q", tt.table.Ident(), got, want)
		}
	}
	if _, err := e.conn.Exec(ctx, `CREATE TABLE raw.other (event_id text, event_time timestamptz, ingested_at timestamptz, payload json,
		kafka_topic text, kafka_partition integer, kafka_offset bigint)`); err != nil {
		t.Fatal(err)
	}
	if ok, err := raw.EventColumns.BinaryCopyFits(ctx, e.conn, raw.TableIdent("other")); err != nil || ok {
		t.Errorf("a payload of type json fits a binary COPY of jsonb: %v (%v)", ok, err)
	}
}
