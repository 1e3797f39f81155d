package raw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/pgcollate"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// Schema is the schema of the raw tables, one per source.
const Schema = "raw"

// TableName is the raw table of source.
func TableName(source string) pgx.Identifier { return pgx.Identifier{Schema, source} }

// TableIdent is the raw table of source, quoted for the text of a
// statement.
func TableIdent(source string) string { return pgquote.Ident(Schema, source) }

// createRawTableSQL creates raw.<source>, range-partitioned by event time.
// An event is identified by (event_id, event_time): PostgreSQL requires the
// partition key in every unique constraint of a partitioned table, and a
// producer's duplicates carry the same event time. %[1]s is the quoted
// table name, %[2]s the quoted name of the ingested_at index.
//
// event_id is compared byte by byte (COLLATE "C"): the key only tells
// events apart, and under a linguistic collation such as en_US.UTF-8
// every comparison of the primary key's b-tree goes through strcoll,
// which made a COPY of a million raw rows take about 40% longer
// (BenchmarkRawKeyCollation). Equality is the same under both: a
// database's default collation is deterministic, so two ids are equal
// under it exactly when their bytes are.
//
// Rows are appended in the order they are loaded, so the ingestion time
// follows the rows' physical order and a BRIN index on it finds the rows of
// given loads (the reconciler's beyond-horizon recording) at a small part
// of the cost of a b-tree on every insert.
var createRawTableSQL = createTableSQL(EventColumns)

// createChangeTableSQL creates raw.<source> for a source of row changes (a
// poll or CDC source): one row per change of a source row. For a poll
// source the change is identified by the row's key (event_id, as text) and
// its updated_at (event_time); for a CDC source by the commit LSN and the
// change's position in its transaction (event_id) and the source commit
// time (event_time). op is insert, update, delete or truncate; payload is
// the row after the change (for a delete, what the source sent of the old
// row); row_key is the row's key as text; old_row the old key or row sent
// with a CDC update or delete; commit_lsn the CDC commit's LSN.
var createChangeTableSQL = createTableSQL(ChangeColumns)

// createTableSQL is the CREATE TABLE of a raw table of the columns cols,
// with load_xid, the id of the writing transaction, and the primary key
// (event_id, event_time), partitioned by event time; %[1]s is the table.
func createTableSQL(cols Columns) string {
	return "CREATE TABLE IF NOT EXISTS %[1]s (\n" + cols.define() +
		"    load_xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),\n" +
		"    PRIMARY KEY (event_id, event_time)\n) PARTITION BY RANGE (event_time)"
}

// createIngestedAtIndexSQL indexes a raw table's ingestion time (see
// createRawTableSQL). It is a statement of its own: Citus propagates the
// index of a distributed table to its shards, which it cannot do for a
// statement that arrives among others in one query string.
const createIngestedAtIndexSQL = `CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s USING brin (ingested_at) WITH (autosummarize = on)`

// A partition is created as a table of its own and then attached: ATTACH
// PARTITION takes only a SHARE UPDATE EXCLUSIVE lock on the parent, which
// does not wait for (or block) readers and writers of the raw table, where
// CREATE TABLE ... PARTITION OF needs an ACCESS EXCLUSIVE lock. %[1]s is the
// partition, %[2]s the parent; bounds are literals from formatBound, since
// DDL takes no parameters.
const (
	createPartitionTableSQL = `CREATE TABLE %[1]s (LIKE %[2]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)`
	attachPartitionSQL      = `ALTER TABLE %[2]s ATTACH PARTITION %[1]s FOR VALUES FROM ('%[3]s') TO ('%[4]s')`

	// partitionStatusSQL says whether a table of the partition's name
	// exists and whether it is attached to the parent.
	partitionStatusSQL = `
SELECT c.oid IS NOT NULL, coalesce(i.inhparent = $2::regclass, false)
FROM (SELECT to_regclass($1) AS oid) r
LEFT JOIN pg_class c ON c.oid = r.oid
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid`

	// ddlLockTimeout keeps partition DDL from queueing behind a long lock
	// holder (and everything else from queueing behind it).
	ddlLockTimeout = `SET LOCAL lock_timeout = '10s'`
)

// Raw tables created before the BRIN index indexed load_xid with a b-tree,
// which cost about a fifth of each raw row's insert. ensureIndexes drops it
// once the BRIN index exists.
const (
	legacyIndexSQL     = `SELECT to_regclass($1) IS NOT NULL`
	dropLegacyIndexSQL = `DROP INDEX IF EXISTS %s`
)

// rawKeyCollationSQL gives the collation of a raw table's event_id ($1)
// and whether it compares bytewise.
const rawKeyCollationSQL = `
SELECT c.collname, ` + pgcollate.BytewiseSQL + `
FROM pg_attribute a
JOIN pg_collation c ON c.oid = a.attcollation
CROSS JOIN pg_database d
WHERE a.attrelid = $1::regclass AND a.attname = 'event_id' AND d.datname = current_database()`

// relationExistsSQL says whether the relation $1 exists.
const relationExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// lockRawDDLSQL serialises DDL on one source's raw table across processes.
const lockRawDDLSQL = `SELECT pg_advisory_xact_lock(hashtext('tidemark.raw.' || $1))`

// Table owns the DDL of raw.<source>: the partitioned parent and the
// partitions created on demand as event times arrive.
type Table struct {
	Source string
	By     string // day or month, in UTC
	// Changes selects the shape of a table of row changes (poll sources)
	// instead of Kafka events.
	Changes bool
	// Log receives what Ensure changed on an existing table; nil
	// discards it.
	Log *slog.Logger
	// Local keeps the table on the coordinator of a Citus warehouse
	// (see ForSource); otherwise Ensure distributes a table it creates
	// there, by event_id.
	Local bool

	mu      sync.Mutex
	known   map[time.Time]bool
	checked bool // the key's collation has been looked at
}

// NewTable returns the manager for raw.<source>.
func NewTable(source, by string) *Table {
	return &Table{Source: source, By: by, known: map[time.Time]bool{}}
}

// ForSource returns the manager for raw.<name>, the raw table of the
// source name of cfg: a table of row changes for the sources that mirror
// rows (poll, CDC and Debezium), of Kafka events otherwise. On a Citus
// warehouse Ensure creates it distributed by event_id when
// cfg.Distributes(name).
func ForSource(cfg *config.Config, name string) *Table {
	src := cfg.Sources[name]
	t := NewTable(name, src.RawPartition)
	t.Changes = src.Kind().RowChanges()
	t.Local = !cfg.Distributes(name)
	return t
}

// NewChangeTable returns the manager for raw.<source> of a source of row
// changes.
func NewChangeTable(source, by string) *Table {
	t := NewTable(source, by)
	t.Changes = true
	return t
}

// Ident is the quoted, schema-qualified table name.
func (t *Table) Ident() string { return TableIdent(t.Source) }

// listRawPartitionsSQL lists the partitions of a raw table.
const listRawPartitionsSQL = `
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`

// hasOpColumnSQL says whether a raw table is a table of row changes.
const hasOpColumnSQL = `
SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'op' AND NOT attisdropped)`

// ErrPartitioningChanged means raw.<source> is partitioned or shaped
// differently from the configuration; retrying cannot help.
var ErrPartitioningChanged = errors.New("raw table partitioning differs from the configuration")

// Ensure creates the parent table and its indexes if missing, and checks
// that existing partitions follow the configured granularity.
func (t *Table) Ensure(ctx context.Context, conn *pgx.Conn) error {
	idx := pgquote.Ident(t.Source + "_ingested_at")
	var names []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockRawDDLSQL, t.Source); err != nil {
			return err
		}
		create := createRawTableSQL
		if t.Changes {
			create = createChangeTableSQL
		}
		var existed bool
		if err := tx.QueryRow(ctx, relationExistsSQL, t.Ident()).Scan(&existed); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(create, t.Ident())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(createIngestedAtIndexSQL, t.Ident(), idx)); err != nil {
			return err
		}
		if !existed {
			if err := t.distribute(ctx, tx); err != nil {
				return err
			}
		}
		var hasOp bool
		if err := tx.QueryRow(ctx, hasOpColumnSQL, t.Ident()).Scan(&hasOp); err != nil {
			return err
		}
		if hasOp != t.Changes {
			kind := map[bool]string{false: "Kafka events", true: "row changes"}
			return fmt.Errorf("%w: %s holds %s but sources.%s now configures %s; use a new source name",
				ErrPartitioningChanged, t.Ident(), kind[hasOp], t.Source, kind[t.Changes])
		}
		if existed && t.Changes {
			if err := widenOpCheck(ctx, tx, t.Ident()); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, listRawPartitionsSQL, t.Ident())
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return fmt.Errorf("create raw table %s: %w", t.Ident(), err)
	}
	if err := t.dropLegacyIndex(ctx, conn); err != nil {
		return err
	}
	if err := t.checkKeyCollation(ctx, conn); err != nil {
		return err
	}
	layout := "20060102"
	if t.By == "month" {
		layout = "200601"
	}
	// What the table holds now replaces what this process remembered:
	// retention may have dropped partitions since.
	known := map[time.Time]bool{}
	for _, name := range names {
		suffix, ok := strings.CutPrefix(name, t.Source+"_p")
		start, err := time.Parse(layout, suffix)
		if !ok || err != nil || len(suffix) != len(layout) {
			return fmt.Errorf("%w: %s has partition %s, which is not a %s partition; sources.%s.raw_partition must match how the table was created",
				ErrPartitioningChanged, t.Ident(), name, t.By, t.Source)
		}
		known[start] = true
	}
	t.mu.Lock()
	t.known = known
	t.mu.Unlock()
	return nil
}

// distribute makes the table, just created, a Citus distributed table by
// event_id on a Citus warehouse unless t.Local, colocated with the raw
// tables distributed before it that have the shard count asked for: the
// partitions attached to it later are distributed with it, each row on
// the worker its event id hashes to. A table that exists is left as it
// is, distributed or not: converting one copies all its rows.
func (t *Table) distribute(ctx context.Context, tx pgx.Tx) error {
	if t.Local {
		return nil
	}
	on, err := citus.Enabled(ctx, tx)
	if err != nil || !on {
		return err
	}
	var with string
	if err := tx.QueryRow(ctx, distributedRawTableSQL).Scan(&with); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look for a distributed raw table: %w", err)
	}
	return citus.Distribute(ctx, tx, t.Ident(), "event_id", with)
}

// distributedRawTableSQL names a raw table distributed before (a
// partitioned parent hashed by event_id) with as many shards as
// citus.shard_count asks for now, the one a new raw table is colocated
// with: the first of them.
const distributedRawTableSQL = `
SELECT p.logicalrelid::regclass::text
FROM pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = 'raw'::regnamespace AND c.relkind = 'p' AND p.partmethod = 'h'
  AND column_to_column_name(p.logicalrelid, p.partkey) = 'event_id'
  AND (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) = current_setting('citus.shard_count')::int
ORDER BY p.colocationid, c.oid
LIMIT 1`

// dropLegacyIndex drops the load_xid b-tree of a raw table created before
// the BRIN index on ingested_at. DROP INDEX needs an ACCESS EXCLUSIVE lock
// on the table; if a reader or writer holds the table for longer than the
// DDL lock timeout, the index stays until the next start, which costs
// insert speed but nothing else.
func (t *Table) dropLegacyIndex(ctx context.Context, conn *pgx.Conn) error {
	legacy := pgquote.Ident(Schema, t.Source+"_load_xid")
	var exists bool
	if err := conn.QueryRow(ctx, legacyIndexSQL, legacy).Scan(&exists); err != nil {
		return fmt.Errorf("look for index %s: %w", legacy, err)
	}
	if !exists {
		return nil
	}
	log := t.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ddlLockTimeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, lockRawDDLSQL, t.Source); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(dropLegacyIndexSQL, legacy))
		return err
	})
	switch {
	case pgerr.LockNotAvailable(err):
		log.Warn("raw table busy: its load_xid index, which the ingested_at index replaces, stays until the next start",
			"table", t.Ident(), "index", legacy)
		return nil
	case err != nil:
		return fmt.Errorf("drop index %s: %w", legacy, err)
	}
	log.Info("dropped the raw table's load_xid index; its BRIN index on ingested_at replaces it", "table", t.Ident(), "index", legacy)
	return nil
}

// checkKeyCollation says once, at Info, when the table's event_id, as an
// earlier version created it, compares through a linguistic collation:
// every write then pays strcoll in the primary key, and the operations
// guide has the statement that converts it (tidemark does not: it rebuilds
// every partition's key under an ACCESS EXCLUSIVE lock).
func (t *Table) checkKeyCollation(ctx context.Context, conn *pgx.Conn) error {
	t.mu.Lock()
	checked := t.checked
	t.mu.Unlock()
	if checked {
		return nil
	}
	var name string
	var bytewise bool
	if err := conn.QueryRow(ctx, rawKeyCollationSQL, t.Ident()).Scan(&name, &bytewise); err != nil {
		return fmt.Errorf("read the collation of %s.event_id: %w", t.Ident(), err)
	}
	t.mu.Lock()
	checked, t.checked = t.checked, true
	t.mu.Unlock()
	if !checked && !bytewise && t.Log != nil {
		t.Log.Info(`raw table compares event_id through a linguistic collation, which makes its writes dearer; ALTER TABLE ... ALTER COLUMN event_id TYPE text COLLATE "C" converts it (see the runbook, "A raw table compares event_id through a linguistic collation")`,
			"table", t.Ident(), "collation", name)
	}
	return nil
}

// PartitionStart returns the start of the partition holding ts.
func (t *Table) PartitionStart(ts time.Time) time.Time {
	ts = ts.UTC()
	if t.By == "month" {
		return time.Date(ts.Year(), ts.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(ts.Year(), ts.Month(), ts.Day(), 0, 0, 0, 0, time.UTC)
}

// UnixHour is the number of the UTC hour t falls in, counted from the Unix
// epoch: integer arithmetic, for the per-row loops of a write. Ledger rows
// are kept per source and UTC hour of event time.
func UnixHour(t time.Time) int64 {
	u := t.Unix()
	h := u / 3600
	if u%3600 < 0 {
		h--
	}
	return h
}

// PartitionEnd returns the end of the partition that starts at start.
func (t *Table) PartitionEnd(start time.Time) time.Time {
	if t.By == "month" {
		return start.AddDate(0, 1, 0)
	}
	return start.AddDate(0, 0, 1)
}

// PartitionName returns the name, in schema raw, of the partition that
// starts at start.
func (t *Table) PartitionName(start time.Time) string {
	if t.By == "month" {
		return t.Source + "_p" + start.Format("200601")
	}
	return t.Source + "_p" + start.Format("20060102")
}

// Missing returns the partition starts needed for times that this process
// has not yet created or seen.
func (t *Table) Missing(times []time.Time) []time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Time
	seen := map[time.Time]bool{}
	// Partitions begin on a UTC hour, so one time of each hour stands for
	// the hour's others: a batch of many rows looks up a few hundred.
	hours := map[int64]bool{}
	for _, ts := range times {
		h := UnixHour(ts)
		if hours[h] {
			continue
		}
		hours[h] = true
		s := t.PartitionStart(ts)
		if t.known[s] || seen[s] {
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// EnsurePartitions creates the partitions starting at starts, in their own
// transaction under the source's DDL lock so that several ingesters creating
// the same partition at once do not collide.
func (t *Table) EnsurePartitions(ctx context.Context, conn *pgx.Conn, starts []time.Time) error {
	if len(starts) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ddlLockTimeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, lockRawDDLSQL, t.Source); err != nil {
			return err
		}
		for _, s := range starts {
			name := pgquote.Ident(Schema, t.PartitionName(s))
			var exists, attached bool
			if err := tx.QueryRow(ctx, partitionStatusSQL, name, t.Ident()).Scan(&exists, &attached); err != nil {
				return err
			}
			switch {
			case attached:
				continue
			case exists:
				return fmt.Errorf("table %s exists but is not a partition of %s; attach it for [%s, %s) or rename it",
					name, t.Ident(), formatBound(s), formatBound(t.PartitionEnd(s)))
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(createPartitionTableSQL, name, t.Ident())); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(attachPartitionSQL, name, t.Ident(), formatBound(s), formatBound(t.PartitionEnd(s)))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create partitions of %s: %w", t.Ident(), err)
	}
	t.mu.Lock()
	for _, s := range starts {
		t.known[s] = true
	}
	t.mu.Unlock()
	return nil
}

// Precreate creates the partitions around now (the previous, current and
// next two partitions), so that writes rarely have to create one.
func (t *Table) Precreate(ctx context.Context, conn *pgx.Conn, now time.Time) error {
	var times []time.Time
	for p := t.PartitionStart(now.AddDate(0, 0, -1)); len(times) < 4; p = t.PartitionEnd(p) {
		times = append(times, p)
	}
	return t.EnsurePartitions(ctx, conn, t.Missing(times))
}

// Forget drops the cache of known partitions, after one was found missing.
func (t *Table) Forget() {
	t.mu.Lock()
	t.known = map[time.Time]bool{}
	t.mu.Unlock()
}

func formatBound(ts time.Time) string { return ts.UTC().Format("2006-01-02 15:04:05+00") }

// ErrMissingPartition means a raw partition disappeared after it was seen
// (retention dropped it while a load was writing): the loads wrap the
// error pgerr.MissingPartition recognises with it, and repeat the write
// once the partition cache is dropped (Forget).
var ErrMissingPartition = errors.New("raw partition missing")

// SQL of widening the op check of a change table made before resyncs
// recorded the rows they copy (op snapshot).
const (
	narrowOpChecksSQL = `
SELECT conname::text FROM pg_constraint
WHERE conrelid = $1::regclass AND contype = 'c'
  AND pg_get_constraintdef(oid) LIKE '%op%insert%' AND pg_get_constraintdef(oid) NOT LIKE '%snapshot%'`
	// widenOpCheckSQL replaces the check without reading the rows, which
	// the old check held. %[1]s table, %[2]s constraint.
	widenOpCheckSQL = `ALTER TABLE %[1]s DROP CONSTRAINT %[2]s,
    ADD CONSTRAINT %[2]s CHECK (op IN ('insert', 'update', 'delete', 'truncate', 'snapshot')) NOT VALID`
)

// widenOpCheck lets the change table ident hold op snapshot.
func widenOpCheck(ctx context.Context, tx pgx.Tx, ident string) error {
	rows, err := tx.Query(ctx, narrowOpChecksSQL, ident)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := tx.Exec(ctx, fmt.Sprintf(widenOpCheckSQL, ident, pgquote.Ident(n))); err != nil {
			return fmt.Errorf("let %s hold the rows resyncs copy: %w", ident, err)
		}
	}
	return nil
}
