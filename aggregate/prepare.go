package aggregate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// targetColumnsSQL lists the columns of a table (none when it is missing).
const targetColumnsSQL = `
SELECT a.attname, a.atttypid::int8, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

// assignableSQL says whether a value of type $1 can be stored in a column
// of type $2 without an explicit cast.
const assignableSQL = `
SELECT $1::oid = $2::oid
    OR EXISTS (SELECT 1 FROM pg_cast WHERE castsource = $1::oid AND casttarget = $2::oid AND castcontext IN ('a', 'i'))
    OR (SELECT typbasetype FROM pg_type WHERE oid = $2::oid) = $1::oid`

// stateReadsSQL lists the relations of the schema tidemark that the view
// $1 reads, directly or through other views, besides $2, the raw table
// that {{events}} reads. A view records in pg_depend every relation its
// query names, however it is spelled (quoted, in another case, found
// through search_path).
const stateReadsSQL = `
WITH RECURSIVE reads(oid) AS (
    SELECT d.refobjid
    FROM pg_rewrite r
    JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
    WHERE r.ev_class = $1::regclass AND d.refobjid <> r.ev_class
  UNION
    SELECT d.refobjid
    FROM reads
    JOIN pg_class v ON v.oid = reads.oid AND v.relkind = 'v'
    JOIN pg_rewrite r ON r.ev_class = v.oid
    JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
    WHERE d.refobjid <> r.ev_class
)
SELECT DISTINCT format('%I.%I', n.nspname, c.relname)
FROM reads
JOIN pg_class c ON c.oid = reads.oid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'tidemark' AND c.oid IS DISTINCT FROM to_regclass($2)
ORDER BY 1`

// column is an output column of the aggregate query.
type column struct {
	name     string
	typeOID  uint32
	typeName string
}

// Prepare checks the aggregate against the warehouse and makes it ready
// for Rebuild: the query must parse and name every output column, one of
// them the partition column, and must not read tables of the schema
// tidemark (ErrReadsState); the target table is created from the query's
// columns when it does not exist (with an index on the partition column),
// and otherwise must accept them. Errors name the configuration key to
// fix. conn must not be in a transaction.
func Prepare(ctx context.Context, conn *pgx.Conn, d *Definition) error {
	key := "aggregates." + d.Name + ".sql"
	// Describing the query for a sample partition checks its syntax, its
	// references and its output columns without running it, wrapped as
	// every rebuild wraps it.
	sample := d.Calendar.Of(time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC))
	q := d.query(sample)
	sd, err := conn.PgConn().Prepare(ctx, "", q, nil)
	if err != nil {
		if atSemicolon(q, err) {
			return fmt.Errorf("%s: must be one SELECT, not ended by a semicolon: %w", key, err)
		}
		return fmt.Errorf("%s: %w", key, err)
	}
	var cols []column
	seen := map[string]bool{}
	for _, f := range sd.Fields {
		name := f.Name
		if name == "" || name == "?column?" {
			return fmt.Errorf("%s: every output column needs a name (use AS)", key)
		}
		if seen[name] {
			return fmt.Errorf("%s: output column %q appears twice", key, name)
		}
		seen[name] = true
		var typeName string
		if err := conn.QueryRow(ctx, "SELECT format_type($1::oid, $2)", f.DataTypeOID, f.TypeModifier).Scan(&typeName); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		cols = append(cols, column{name: name, typeOID: f.DataTypeOID, typeName: typeName})
	}
	if !seen[d.Column] {
		return fmt.Errorf("%s: the query must return the partition column %q (for example {{partition}} AS %s)", key, d.Column, d.Column)
	}
	if err := checkStateReads(ctx, conn, d, sample); err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockPartitionSQL, "tidemark.aggregate."+d.Name); err != nil {
			return err
		}
		existing, err := targetColumns(ctx, tx, d.Target)
		if err != nil {
			return err
		}
		if len(existing) == 0 {
			return createTarget(ctx, tx, d, cols)
		}
		return checkTarget(ctx, tx, d, cols, existing)
	})
	if err != nil {
		return err
	}
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	if d.onCitus, err = citus.Enabled(ctx, conn); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	d.columns = names
	return nil
}

// checkStateReads refuses a query that reads tables of the schema
// tidemark, directly or through views. The query, for partition p,
// becomes a temporary view in a transaction that is rolled back, and the
// relations the view depends on are looked up in the catalog: unlike a
// search of the text, that is neither fooled by quoting or search_path nor
// set off by a string literal, a comment or an alias. What a function
// called by the query reads is not seen. The check reads {{events}} as
// the correction policy writes it, since under the arrival policy
// {{events}} itself reads tidemark.corrections.
func checkStateReads(ctx context.Context, conn *pgx.Conn, d *Definition, p Partition) error {
	key := "aggregates." + d.Name + ".sql"
	own := *d
	own.Policy = Correction
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "CREATE TEMPORARY VIEW tidemark_prepare AS "+own.query(p)); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	rows, err := tx.Query(ctx, stateReadsSQL, "pg_temp.tidemark_prepare", d.Raw.Sanitize())
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	reads, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	if len(reads) > 0 {
		return fmt.Errorf("%s: %w: it reads %s", key, ErrReadsState, strings.Join(reads, ", "))
	}
	return nil
}

type targetColumn struct {
	typeOID  uint32
	typeName string
	notNull  bool
	hasDef   bool
}

func targetColumns(ctx context.Context, tx pgx.Tx, target pgx.Identifier) (map[string]targetColumn, error) {
	rows, err := tx.Query(ctx, targetColumnsSQL, target.Sanitize())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]targetColumn{}
	for rows.Next() {
		var name string
		var oid int64
		var c targetColumn
		if err := rows.Scan(&name, &oid, &c.typeName, &c.notNull, &c.hasDef); err != nil {
			return nil, err
		}
		c.typeOID = uint32(oid)
		out[name] = c
	}
	return out, rows.Err()
}

func createTarget(ctx context.Context, tx pgx.Tx, d *Definition, cols []column) error {
	defs := make([]string, len(cols))
	for i, c := range cols {
		defs[i] = pgquote.Ident(c.name) + " " + c.typeName
		if c.name == d.Column {
			defs[i] += " NOT NULL"
		}
	}
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
	// database even when the schema exists: ask first.
	var schemaExists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", d.Target[0]).Scan(&schemaExists); err != nil {
		return fmt.Errorf("aggregates.%s.table: %w", d.Name, err)
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgquote.Ident(d.Target[0])); err != nil {
			return fmt.Errorf("aggregates.%s.table: %w", d.Name, err)
		}
	}
	ddl := fmt.Sprintf("CREATE TABLE %s (%s)", d.Target.Sanitize(), strings.Join(defs, ", "))
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("aggregates.%s.table: create %s: %w", d.Name, d.Target.Sanitize(), err)
	}
	idx := pgquote.Ident(derivedName(d.Target[1], "_"+d.Column))
	if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE INDEX %s ON %s (%s)", idx, d.Target.Sanitize(), pgquote.Ident(d.Column))); err != nil {
		return fmt.Errorf("aggregates.%s.table: index %s: %w", d.Name, d.Column, err)
	}
	return nil
}

func checkTarget(ctx context.Context, tx pgx.Tx, d *Definition, cols []column, existing map[string]targetColumn) error {
	key := "aggregates." + d.Name
	inQuery := map[string]bool{}
	for _, c := range cols {
		inQuery[c.name] = true
		t, ok := existing[c.name]
		if !ok {
			return fmt.Errorf("%s.sql: output column %q is not a column of %s", key, c.name, d.Target.Sanitize())
		}
		var ok2 bool
		if err := tx.QueryRow(ctx, assignableSQL, c.typeOID, t.typeOID).Scan(&ok2); err != nil {
			return err
		}
		if !ok2 {
			return fmt.Errorf("%s.sql: output column %q is %s, which cannot be stored in %s.%s (%s)",
				key, c.name, c.typeName, d.Target.Sanitize(), c.name, t.typeName)
		}
	}
	want := "date"
	if d.Calendar.By == Hour {
		want = "timestamp with time zone"
	}
	if pc := existing[d.Column]; pc.typeName != want {
		return fmt.Errorf("%s.partition.column: %s.%s is %s; %s partitions need %s", key, d.Target.Sanitize(), d.Column, pc.typeName, d.Calendar.By, want)
	}
	for name, t := range existing {
		if !inQuery[name] && t.notNull && !t.hasDef {
			return fmt.Errorf("%s.sql: %s.%s is NOT NULL without a default, and the query does not return it", key, d.Target.Sanitize(), name)
		}
	}
	return nil
}

// atSemicolon reports whether err is a syntax error at a semicolon of q:
// the user's SQL, a subquery in q, ends its statement (or holds two). The
// configuration refuses a trailing semicolon, but not one followed by a
// comment.
func atSemicolon(q string, err error) bool {
	pos, ok := pgerr.SyntaxError(err)
	if !ok {
		return false
	}
	r := []rune(q) // the position counts characters
	return pos <= len(r) && r[pos-1] == ';'
}
