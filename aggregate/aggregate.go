package aggregate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/raw"
)

// Beyond-horizon policies.
const (
	// Correction keeps a partition final once its horizon has passed:
	// later events are recorded in tidemark.corrections and counted.
	Correction = config.PolicyCorrection
	// Arrival counts an event later than the horizon in the partition of
	// the time it arrived.
	Arrival = config.PolicyArrival
	// RebuildAnyway ignores the horizon: every late event rebuilds its own
	// partition.
	RebuildAnyway = config.PolicyRebuild
)

// Definition is one aggregate, resolved from the configuration.
type Definition struct {
	Name   string
	Source string
	// Raw is the source's raw table and the names of its event-time and
	// ingestion-time columns; EventKey are the columns identifying an
	// event in it.
	Raw        pgx.Identifier
	EventTime  string
	IngestedAt string
	EventKey   []string
	// Target is the aggregate table; Column holds the partition key.
	Target   pgx.Identifier
	Column   string
	Calendar Calendar
	Horizon  time.Duration
	Policy   string
	SQL      string
	// Ledger says the source's loads are recorded in the ingest ledger
	// (Kafka, poll and CDC sources); a table source is read in timestamp
	// mode.
	Ledger bool
	// CorrectionsKept is how long tidemark.corrections keeps a record
	// (retention.corrections): a rebuild records events it leaves out
	// only when they arrived more recently than that.
	CorrectionsKept time.Duration

	columns []string // output columns of SQL, known after Prepare
	// onCitus says that the warehouse has the citus extension, known
	// after Prepare.
	onCitus bool
}

// FromConfig resolves the aggregate named name.
func FromConfig(cfg *config.Config, name string) (*Definition, error) {
	a := cfg.Aggregates[name]
	if a == nil {
		return nil, fmt.Errorf("aggregate: no aggregate named %q", name)
	}
	src := cfg.Sources[a.Source]
	if src == nil {
		return nil, fmt.Errorf("aggregate %s: no source named %q", name, a.Source)
	}
	schema, table := config.SplitTable(a.Table)
	d := &Definition{
		Name:     name,
		Source:   a.Source,
		Target:   pgx.Identifier{schema, table},
		Column:   a.Partition.Column,
		Calendar: Calendar{By: a.Partition.By, Loc: a.Partition.Location()},
		Horizon:  a.LatenessHorizon.Duration(),
		Policy:   a.BeyondHorizon,
		SQL:      strings.TrimSpace(a.SQL),

		CorrectionsKept: cfg.Retention.Corrections.Duration(),
	}
	r := RawOf(a.Source, src)
	d.Raw, d.EventTime, d.IngestedAt, d.EventKey, d.Ledger = r.Table, r.EventTime, r.IngestedAt, r.Key, r.Ledger
	return d, nil
}

// Raw is where a source's events are: its table, the names of its
// event-time and ingestion-time columns and of the columns identifying an
// event, and whether its loads are recorded in the ingest ledger.
type Raw struct {
	Table      pgx.Identifier
	EventTime  string
	IngestedAt string
	Key        []string
	Ledger     bool
}

// RawOf returns where the events of source name (src) are: raw.<name> for
// Kafka, poll and CDC sources, the configured table for a table source.
func RawOf(name string, src *config.Source) Raw {
	if t := src.Table; t != nil {
		rs, rt := config.SplitTable(t.Name)
		return Raw{Table: pgx.Identifier{rs, rt}, EventTime: t.EventTime, IngestedAt: t.IngestedAt, Key: t.Key}
	}
	return Raw{Table: raw.TableName(name), EventTime: "event_time", IngestedAt: "ingested_at",
		Key: []string{"event_id", "event_time"}, Ledger: true}
}

// Of returns the partition holding t.
func (d *Definition) Of(t time.Time) Partition { return d.Calendar.Of(t) }

// HorizonEnd is the ingestion time after which an event of p is beyond the
// lateness horizon.
func (d *Definition) HorizonEnd(p Partition) time.Time { return p.End.Add(d.Horizon) }

// eventsSQL is the table expression {{events}} stands for: the raw rows of
// p with the horizon policy applied. It uses stored columns only, so every
// rebuild of p, incremental or backfill, reads the same rows.
func (d *Definition) eventsSQL(p Partition) string {
	et, ia := pgquote.Ident(d.EventTime), pgquote.Ident(d.IngestedAt)
	raw := d.Raw.Sanitize()
	q := fmt.Sprintf("SELECT * FROM %s WHERE %s >= %s AND %s < %s", raw, et, timeLiteral(p.Start), et, timeLiteral(p.End))
	if d.Policy == RebuildAnyway {
		return q
	}
	q += fmt.Sprintf(" AND %s <= %s", ia, timeLiteral(d.HorizonEnd(p)))
	if d.Policy == Arrival {
		q += fmt.Sprintf(" UNION ALL SELECT (jsonb_populate_record(NULL::%s, c.event)).* FROM tidemark.corrections c"+
			" WHERE c.aggregate = '%s' AND c.arrival_partition_start = %s", raw, d.Name, timeLiteral(p.Start))
	}
	return q
}

// query is the user's SQL for partition p: {{partition}} becomes the typed
// key and {{events}} a common table expression named events, which the
// user's SQL reads as a subquery:
//
//	WITH events AS (<raw rows of p>)
//	SELECT * FROM (
//	<the user's SQL>
//	) AS tidemark_query
//
// The user's SQL stands on lines of its own, inside parentheses, and is
// never rewritten or parsed here: a comment at its end (-- or /* */) ends
// before the closing parenthesis, one at its start before its own WITH
// does no harm, and a statement-ending semicolon is a syntax error that
// Prepare reports. Whatever callers append to query follows its closing
// parenthesis, never the user's text.
func (d *Definition) query(p Partition) string {
	sql := strings.ReplaceAll(d.SQL, "{{partition}}", p.keyLiteral())
	sql = strings.ReplaceAll(sql, "{{events}}", "events")
	return "WITH events AS (" + d.eventsSQL(p) + ")\nSELECT * FROM (\n" + sql + "\n) AS tidemark_query"
}

// Result is what one rebuild did.
type Result struct {
	Rows int64
	// Recorded counts the events beyond the horizon that the rebuild left
	// out and recorded in tidemark.corrections (see RecordBeyond).
	Recorded int64
}

// ErrOutsidePartition means the aggregate's query returned rows whose
// partition column is not the partition being rebuilt.
var ErrOutsidePartition = errors.New("aggregate: query returned rows outside the partition")

// ErrReadsState means the aggregate's query reads tables of the schema
// tidemark, directly or through views. Prepare refuses it: that state is
// tidemark's own, changes without queueing the partitions that read it
// (so a rebuild would depend on when it ran) and may change its layout
// with any release.
var ErrReadsState = errors.New("aggregate: the query reads tidemark's own tables, which aggregate queries may not read")

// ErrNotPrepared is returned by Rebuild for a definition that Prepare has
// not checked against the warehouse.
var ErrNotPrepared = errors.New("aggregate: definition not prepared")

const (
	lockPartitionSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`

	archivePartitionSQL = `
UPDATE tidemark.partitions SET state = 'archived', archived_at = coalesce(archived_at, $3), updated_at = $3
WHERE aggregate = $1 AND partition_start = $2`

	// snapshotXminSQL is the oldest transaction still running: every
	// transaction below it has finished.
	snapshotXminSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`

	// upsertPartitionSQL records a rebuild in the status table. The load
	// watermark it reflects is the oldest transaction still running when
	// the rebuild began: every raw row of an older transaction is in it.
	upsertPartitionSQL = `
INSERT INTO tidemark.partitions AS p (aggregate, partition_start, partition_end, partition_key, rows, rebuilt_at,
                                      rebuilds, load_watermark, final_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 1, $7::text::xid8, $8, $6)
ON CONFLICT (aggregate, partition_start) DO UPDATE SET
    rows = EXCLUDED.rows, rebuilt_at = EXCLUDED.rebuilt_at, rebuilds = p.rebuilds + 1,
    load_watermark = EXCLUDED.load_watermark, final_at = EXCLUDED.final_at, updated_at = EXCLUDED.updated_at`
)

// Prepared reports whether Prepare has checked the definition, which
// Rebuild and Drift need.
func (d *Definition) Prepared() bool { return d.columns != nil }

// Rebuild replaces partition p of the aggregate, atomically (inside tx)
// and idempotently: it deletes the partition's rows, inserts what the
// aggregate's query returns for it, and records the rebuild in
// tidemark.partitions. It is the only code that writes aggregate tables;
// the reconciler, backfills and full refreshes all call it. now is the
// service clock. A per-partition advisory lock keeps two rebuilds of the
// same partition from running at once.
func Rebuild(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, now time.Time, opts ...RebuildOption) (Result, error) {
	if d.columns == nil {
		return Result{}, ErrNotPrepared
	}
	archived, err := lockPartition(ctx, tx, d, p, rebuildOpts(opts))
	if err != nil {
		return Result{}, err
	}
	var watermark string
	if err := tx.QueryRow(ctx, snapshotXminSQL).Scan(&watermark); err != nil {
		return Result{}, fmt.Errorf("rebuild %s %s: %w", d.Name, p, err)
	}
	if err := d.AwaitWorkers(ctx, tx); err != nil {
		return Result{}, fmt.Errorf("rebuild %s %s: %w", d.Name, p, err)
	}
	target, col, key := d.Target.Sanitize(), pgquote.Ident(d.Column), p.keyLiteral()
	if _, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE %s = %s", target, col, key)); err != nil {
		return Result{}, fmt.Errorf("rebuild %s %s: delete: %w", d.Name, p, err)
	}
	var rows, outside int64
	if err := tx.QueryRow(ctx, d.insertSQL(p)).Scan(&rows, &outside); err != nil {
		return Result{}, fmt.Errorf("rebuild %s %s: %w", d.Name, p, err)
	}
	if outside > 0 {
		return Result{}, fmt.Errorf("rebuild %s %s: %w: %d of %d rows have %s other than {{partition}} (%s)",
			d.Name, p, ErrOutsidePartition, outside, rows, d.Column, p.Label())
	}
	recorded, err := recordExcluded(ctx, tx, d, p, now)
	if err != nil {
		return Result{}, err
	}
	if err := recordStatus(ctx, tx, d, p, rows, now, watermark, archived); err != nil {
		return Result{}, fmt.Errorf("rebuild %s %s: %w", d.Name, p, err)
	}
	return Result{Rows: rows, Recorded: recorded}, nil
}

// AwaitWorkers, on a Citus warehouse (as Prepare found it), waits for the
// loads below a snapshot's xmin just read in tx that are committed on the
// coordinator but not yet on a worker (see citus.AwaitPrepared), so that
// the statements after it read the rows of every load below that xmin: a
// rebuild's and a shadow build's recorded watermark, a reconcile claim's
// bound.
func (d *Definition) AwaitWorkers(ctx context.Context, tx pgx.Tx) error {
	if !d.onCitus {
		return nil
	}
	if err := citus.AwaitPrepared(ctx, tx); err != nil {
		return fmt.Errorf("wait for loads committed on the coordinator to commit on the workers: %w", err)
	}
	return nil
}

// insertSQL is the statement of a rebuild that inserts p's rows into the
// aggregate table and counts them, and those outside p.
func (d *Definition) insertSQL(p Partition) string {
	target, col, key := d.Target.Sanitize(), pgquote.Ident(d.Column), p.keyLiteral()
	cols := make([]string, len(d.columns))
	for i, c := range d.columns {
		cols[i] = pgquote.Ident(c)
	}
	return fmt.Sprintf("WITH ins AS (INSERT INTO %s (%s) %s RETURNING %s) "+
		"SELECT count(*), count(*) FILTER (WHERE %s IS DISTINCT FROM %s) FROM ins",
		target, strings.Join(cols, ", "), d.query(p), col, col, key)
}

// recordStatus records a rebuild of p in tidemark.partitions; a partition
// rebuilt although archived (AllowArchived) stays archived.
func recordStatus(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, rows int64, now time.Time, watermark string, archived bool) error {
	if _, err := tx.Exec(ctx, upsertPartitionSQL, d.Name, p.Start, p.End, p.Label(), rows, now, watermark, d.HorizonEnd(p)); err != nil {
		return fmt.Errorf("record status: %w", err)
	}
	if archived {
		if _, err := tx.Exec(ctx, archivePartitionSQL, d.Name, p.Start, now); err != nil {
			return fmt.Errorf("record status: %w", err)
		}
	}
	return nil
}

// lockPartition takes the partition's lock, which keeps two writers of
// one partition from running at once, and refuses an archived partition
// unless o allows it; it reports whether p is archived.
func lockPartition(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, o rebuildOptions) (bool, error) {
	lock := "tidemark.partition." + d.Name + "." + p.Start.UTC().Format(time.RFC3339)
	if _, err := tx.Exec(ctx, lockPartitionSQL, lock); err != nil {
		return false, fmt.Errorf("rebuild %s %s: lock: %w", d.Name, p, err)
	}
	return retained(ctx, tx, d, p, o.allowArchived)
}

// Comparison is partition p as published in the aggregate's table
// against the rows its query returns now.
type Comparison struct {
	// Published and Fresh count the rows of each side.
	Published, Fresh int64
	// Missing counts rows only the query returns (a rebuild would add
	// them), Extra rows only the table holds (a rebuild would remove them).
	Missing, Extra int64
	// Totals sums each numeric output column on both sides.
	Totals []Total
}

// Total is the sum of one numeric column on both sides of a Comparison,
// as text (NULL sums as "-").
type Total struct {
	Column, Published, Fresh string
}

// Differs reports whether the two sides are different multisets of rows.
func (c Comparison) Differs() bool { return c.Missing > 0 || c.Extra > 0 }

// numericColumnsSQL lists the numeric columns of a table.
const numericColumnsSQL = `
SELECT attname::text FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
  AND atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype, 'float4'::regtype, 'float8'::regtype)`

// Drift compares partition p as published in the aggregate's table with
// what Rebuild would write for it, in tx's snapshot: the query's rows go
// into a temporary table with the aggregate table's columns and types (so
// they are coerced as Rebuild's insert would coerce them), and the two row
// sets are compared as multisets. It writes nothing that outlives tx;
// callers roll tx back. Columns of types without equality (json, point)
// cannot be compared and make it fail.
func Drift(ctx context.Context, tx pgx.Tx, d *Definition, p Partition) (Comparison, error) {
	if d.columns == nil {
		return Comparison{}, ErrNotPrepared
	}
	list := d.columnList()
	steps := []string{
		"DROP TABLE IF EXISTS pg_temp.tidemark_verify",
		fmt.Sprintf("CREATE TEMP TABLE tidemark_verify ON COMMIT DROP AS SELECT %s FROM %s WITH NO DATA", list, d.Target.Sanitize()),
		fmt.Sprintf("INSERT INTO pg_temp.tidemark_verify (%s) %s", list, d.query(p)),
	}
	for _, sql := range steps {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return Comparison{}, fmt.Errorf("verify %s %s: %w", d.Name, p, err)
		}
	}
	return d.compare(ctx, tx, p, "pg_temp.tidemark_verify")
}

// ShadowName is the table that BuildShadow writes for the aggregate, in
// the aggregate table's schema: the table's name with __shadow appended
// (daily_sales__shadow), shortened with a hash of the whole name when that
// is longer than PostgreSQL keeps (see derivedName). It is never the
// aggregate table.
func (d *Definition) ShadowName() pgx.Identifier {
	id := append(pgx.Identifier(nil), d.Target...)
	id[len(id)-1] = derivedName(id[len(id)-1], "__shadow")
	return id
}

// Shadow is what BuildShadow wrote: partition p as its query returns it,
// compared with the published rows.
type Shadow struct {
	Comparison
	// Watermark is the load watermark the build reflects: every load of a
	// transaction below it is in the build.
	Watermark string
	// Archived says the partition was archived, built from what
	// retention left (AllowArchived).
	Archived bool
}

// BuildShadow writes partition p, as the aggregate's query returns it now,
// into the shadow table (created like the aggregate table when missing,
// its rows of p replaced) instead of the aggregate table, and compares it
// with the published partition. It changes neither the aggregate table
// nor tidemark.partitions: a shadow build is for inspecting what a
// backfill would publish, and PublishShadow publishes it.
func BuildShadow(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, opts ...RebuildOption) (Shadow, error) {
	if d.columns == nil {
		return Shadow{}, ErrNotPrepared
	}
	archived, err := retained(ctx, tx, d, p, rebuildOpts(opts).allowArchived)
	if err != nil {
		return Shadow{}, err
	}
	if err := CreateShadow(ctx, tx, d); err != nil {
		return Shadow{}, err
	}
	// The watermark is read before the query's snapshot is taken, so
	// every transaction below it is visible to the query.
	s := Shadow{Archived: archived}
	if err := tx.QueryRow(ctx, snapshotXminSQL).Scan(&s.Watermark); err != nil {
		return Shadow{}, fmt.Errorf("shadow %s %s: %w", d.Name, p, err)
	}
	if err := d.AwaitWorkers(ctx, tx); err != nil {
		return Shadow{}, fmt.Errorf("shadow %s %s: %w", d.Name, p, err)
	}
	shadow, list := d.ShadowName().Sanitize(), d.columnList()
	steps := []string{
		fmt.Sprintf("DELETE FROM %s WHERE %s = %s", shadow, pgquote.Ident(d.Column), p.keyLiteral()),
		fmt.Sprintf("INSERT INTO %s (%s) %s", shadow, list, d.query(p)),
	}
	for _, sql := range steps {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return Shadow{}, fmt.Errorf("shadow %s %s: %w", d.Name, p, err)
		}
	}
	s.Comparison, err = d.compare(ctx, tx, p, shadow)
	return s, err
}

// Execer runs a statement: a connection, a pool or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateShadow creates the aggregate's shadow table, like the aggregate
// table, when it is missing. Callers that build partitions concurrently
// call it once first: concurrent CREATE TABLE IF NOT EXISTS of one name
// can fail.
func CreateShadow(ctx context.Context, db Execer, d *Definition) error {
	sql := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (LIKE %s INCLUDING DEFAULTS)", d.ShadowName().Sanitize(), d.Target.Sanitize())
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("shadow %s: create %s: %w", d.Name, d.ShadowName().Sanitize(), err)
	}
	return nil
}

func (d *Definition) columnList() string {
	cols := make([]string, len(d.columns))
	for i, c := range d.columns {
		cols[i] = pgquote.Ident(c)
	}
	return strings.Join(cols, ", ")
}

// compare compares partition p of the aggregate table with the rows of p
// in fresh, a table with the query's columns.
func (d *Definition) compare(ctx context.Context, tx pgx.Tx, p Partition, fresh string) (Comparison, error) {
	var c Comparison
	target, col, key, list := d.Target.Sanitize(), pgquote.Ident(d.Column), p.keyLiteral(), d.columnList()
	rows, err := tx.Query(ctx, numericColumnsSQL, target)
	if err != nil {
		return c, fmt.Errorf("compare %s %s: %w", d.Name, p, err)
	}
	numeric, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return c, fmt.Errorf("compare %s %s: %w", d.Name, p, err)
	}
	var sums []string
	for _, n := range numeric {
		if n == d.Column || !slices.Contains(d.columns, n) {
			continue
		}
		c.Totals = append(c.Totals, Total{Column: n})
		sums = append(sums, fmt.Sprintf(", coalesce((SELECT sum(%[1]s)::text FROM %[2]s WHERE %[3]s = %[4]s), '-')"+
			", coalesce((SELECT sum(%[1]s)::text FROM %[5]s WHERE %[3]s = %[4]s), '-')", pgquote.Ident(n), target, col, key, fresh))
	}
	sql := fmt.Sprintf(`SELECT
    (SELECT count(*) FROM %[2]s WHERE %[3]s = %[4]s),
    (SELECT count(*) FROM %[5]s WHERE %[3]s = %[4]s),
    (SELECT count(*) FROM (SELECT %[1]s FROM %[5]s WHERE %[3]s = %[4]s EXCEPT ALL SELECT %[1]s FROM %[2]s WHERE %[3]s = %[4]s) m),
    (SELECT count(*) FROM (SELECT %[1]s FROM %[2]s WHERE %[3]s = %[4]s EXCEPT ALL SELECT %[1]s FROM %[5]s WHERE %[3]s = %[4]s) x)%[6]s`,
		list, target, col, key, fresh, strings.Join(sums, ""))
	dest := []any{&c.Published, &c.Fresh, &c.Missing, &c.Extra}
	for i := range c.Totals {
		dest = append(dest, &c.Totals[i].Published, &c.Totals[i].Fresh)
	}
	if err := tx.QueryRow(ctx, sql).Scan(dest...); err != nil {
		return c, fmt.Errorf("compare %s %s: %w", d.Name, p, err)
	}
	return c, nil
}
