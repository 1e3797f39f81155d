// Package mirror owns mirror tables: warehouse copies of source tables kept
// by poll and CDC sources. A mirror has the source table's columns with the
// source's key as its primary key, plus two columns of its own: when each
// row was last loaded, and when it was found deleted at the source (soft
// deletes; hard deletes remove the row).
//
// The package reads a source table's shape from the source's catalog,
// checks that the configured key is a unique key there, creates the mirror
// when it is missing, adds columns the source has gained, and refuses a
// mirror whose columns disagree with the source. A mirror without a
// reachable source (a Debezium source's) is read from the warehouse
// catalog, or created from the columns its change events declare
// (ReadTarget, EnsureTarget). On a Citus warehouse a mirror created with
// Table.Distribute set is a distributed table hashed by its first key
// column.
//
// # Applying changes
//
// Changes folds a run of row changes per key into one upsert or delete per
// key, and a Writer writes them, one warehouse transaction (Txn) at a
// time: each relation's net changes are staged with one COPY and applied
// with a few set-based statements. Unsent values (unchanged TOAST, values
// a Debezium connector did not have) keep the stored ones; a key change
// takes the old key's; deletes flag or remove the row. CDC sources send
// text rows; Debezium sources send JSON rows that PostgreSQL converts
// (Relation.JSON) and keep each row's source position (Relation.Position),
// so that a change sent again never moves a row backwards.
//
// # Key reconciliation
//
// A KeyReconciler finds the rows of a mirror that were hard deleted at the
// source, which no updated_at watermark can see. It compares key ranges of
// the two tables by count and hash sum, descends only into ranges that
// differ, looks up the keys of small differing ranges at the source, and
// flags or removes the rows whose key is gone.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/connerr"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// Column is one column of a source table.
type Column struct {
	Name    string
	Type    string // as format_type prints it, e.g. numeric(12,2)
	NotNull bool
}

// Table describes one mirrored table.
type Table struct {
	// Name is the tidemark source the mirror belongs to.
	Name   string
	Source pgx.Identifier // the source table
	Target pgx.Identifier // the mirror in the warehouse
	Key    []string
	// Columns are the source's columns in order; filled by Describe.
	Columns []Column
	// DeletedColumn and LoadedColumn are the mirror's own columns.
	DeletedColumn string
	LoadedColumn  string
	// Hard is true when rows deleted at the source are removed from the
	// mirror rather than flagged.
	Hard bool
	// Distribute makes Ensure, on a Citus warehouse, create the mirror as
	// a distributed table hashed by its first key column (see
	// distribute); config.Config.Distributes says which sources' mirrors
	// are.
	Distribute bool
	// TableKey and KeyKey are the configuration keys, below the source,
	// that name the source table and its key, for Describe's errors;
	// empty: a poll source's poll.table and poll.key.
	TableKey, KeyKey string
}

// configKeys returns TableKey and KeyKey, or their defaults.
func (t *Table) configKeys() (string, string) {
	table, key := t.TableKey, t.KeyKey
	if table == "" {
		table = "poll.table"
	}
	if key == "" {
		key = "poll.key"
	}
	return table, key
}

// FromConfig returns the mirror of a poll source, without its columns.
func FromConfig(src *config.Source) (*Table, error) {
	if src.Kind() != config.KindPoll || src.Mirror == nil {
		return nil, fmt.Errorf("mirror: source %s has no poll and mirror blocks", src.Name)
	}
	ss, st := config.SplitTable(src.Poll.Table)
	ts, tt := config.SplitTable(src.Mirror.Table)
	return &Table{
		Name:          src.Name,
		Source:        pgx.Identifier{ss, st},
		Target:        pgx.Identifier{ts, tt},
		Key:           slices.Clone(src.Poll.Key),
		DeletedColumn: src.Mirror.DeletedColumn,
		LoadedColumn:  src.Mirror.LoadedColumn,
		Hard:          src.Mirror.Deletes == config.DeletesHard,
	}, nil
}

// Column returns the source column called name.
func (t *Table) Column(name string) (Column, bool) {
	for _, c := range t.Columns {
		if c.Name == name {
			return c, true
		}
	}
	return Column{}, false
}

// ColumnNames returns the source's column names in order.
func (t *Table) ColumnNames() []string {
	out := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Name
	}
	return out
}

// ErrSource means the source table cannot be mirrored as configured.
var ErrSource = errors.New("mirror: source table")

// ErrMirror means the mirror table exists in a shape tidemark cannot use.
var ErrMirror = errors.New("mirror: table")

const (
	// columnsSQL lists a table's live columns in order; $1 is a quoted,
	// qualified name.
	columnsSQL = `
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

	// uniqueKeySQL says whether a table has a unique index (or primary
	// key), without predicate or expressions, on exactly the columns $2.
	uniqueKeySQL = `
SELECT EXISTS (
    SELECT 1 FROM pg_index i
    WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
      AND i.indnkeyatts = cardinality($2::text[])
      AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
           WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey[0:i.indnkeyatts - 1]))
          = (SELECT array_agg(k ORDER BY k) FROM unnest($2::text[]) AS k))`

	existsSQL       = `SELECT to_regclass($1) IS NOT NULL`
	schemaExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`
	lockDDLSQL      = `SELECT pg_advisory_xact_lock(hashtextextended('tidemark.mirror.' || $1, 0))`
)

// Describe reads the source table's columns and checks the configuration
// against them: the key columns exist, are NOT NULL and form a unique key;
// the mirror's own column names are not source columns.
func (t *Table) Describe(ctx context.Context, src *pgx.Conn) error {
	cols, err := readColumns(ctx, src, t.Source)
	if err != nil {
		return fmt.Errorf("mirror %s: read source columns: %w", t.Name, err)
	}
	tableKey, keyKey := t.configKeys()
	if len(cols) == 0 {
		return fmt.Errorf("%w %s does not exist or has no columns (sources.%s.%s)", ErrSource, t.Source.Sanitize(), t.Name, tableKey)
	}
	t.Columns = cols
	for _, k := range t.Key {
		c, ok := t.Column(k)
		switch {
		case !ok:
			return fmt.Errorf("%w %s has no column %s (sources.%s.%s)", ErrSource, t.Source.Sanitize(), k, t.Name, keyKey)
		case !c.NotNull:
			return fmt.Errorf("%w %s: key column %s may be NULL; a key must be NOT NULL (sources.%s.%s)", ErrSource, t.Source.Sanitize(), k, t.Name, keyKey)
		}
	}
	var unique bool
	if err := src.QueryRow(ctx, uniqueKeySQL, t.Source.Sanitize(), t.Key).Scan(&unique); err != nil {
		return fmt.Errorf("mirror %s: check the source key: %w", t.Name, err)
	}
	if !unique {
		return fmt.Errorf("%w %s has no primary key or unique index on (%s); the key must identify one row (sources.%s.%s)",
			ErrSource, t.Source.Sanitize(), strings.Join(t.Key, ", "), t.Name, keyKey)
	}
	for key, col := range map[string]string{"deleted_column": t.DeletedColumn, "loaded_column": t.LoadedColumn} {
		if _, clash := t.Column(col); clash {
			return fmt.Errorf("%w %s has a column %s, which the mirror uses for itself; set sources.%s.mirror.%s to another name",
				ErrSource, t.Source.Sanitize(), col, t.Name, key)
		}
	}
	return nil
}

// Reload replaces Columns with the columns the mirror table has in the
// warehouse now, its loaded and deleted columns left out: after DDL on
// the mirror was rolled back, what the table has is what counts.
func (t *Table) Reload(ctx context.Context, wh *pgx.Conn) error {
	cols, err := readColumns(ctx, wh, t.Target)
	if err != nil {
		return fmt.Errorf("mirror %s: read the mirror's columns: %w", t.Name, err)
	}
	t.Columns = slices.DeleteFunc(cols, func(c Column) bool { return c.Name == t.LoadedColumn || c.Name == t.DeletedColumn })
	return nil
}

func readColumns(ctx context.Context, conn *pgx.Conn, table pgx.Identifier) ([]Column, error) {
	rows, err := conn.Query(ctx, columnsSQL, table.Sanitize())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Column, error) {
		var c Column
		err := r.Scan(&c.Name, &c.Type, &c.NotNull)
		return c, err
	})
}

// SourceChanged reports whether the source table's columns (names and
// types, in order) differ from those Describe read. Inside a transaction
// that has read the table, the answer holds until the transaction ends:
// ALTER TABLE waits for the transaction's lock.
func (t *Table) SourceChanged(ctx context.Context, src *pgx.Conn) (bool, error) {
	cols, err := readColumns(ctx, src, t.Source)
	if err != nil {
		return false, fmt.Errorf("mirror %s: read source columns: %w", t.Name, err)
	}
	if len(cols) != len(t.Columns) {
		return true, nil
	}
	for i, c := range cols {
		if c.Name != t.Columns[i].Name || c.Type != t.Columns[i].Type {
			return true, nil
		}
	}
	return false, nil
}

// Ensure makes the mirror match the source described by Describe: it
// creates the table when missing, adds columns the source has gained, and
// fails when a column's type differs or the key is not the mirror's
// primary key or a unique index.
func (t *Table) Ensure(ctx context.Context, wh *pgx.Conn) error {
	if len(t.Columns) == 0 {
		return fmt.Errorf("mirror %s: Ensure before Describe", t.Name)
	}
	err := pgx.BeginFunc(ctx, wh, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockDDLSQL, t.Target.Sanitize()); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, existsSQL, t.Target.Sanitize()).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return t.create(ctx, tx)
		}
		return t.extend(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("mirror %s (%s): %w", t.Name, t.Target.Sanitize(), err)
	}
	return nil
}

func (t *Table) create(ctx context.Context, tx pgx.Tx) error {
	var schemaExists bool
	if err := tx.QueryRow(ctx, schemaExistsSQL, t.Target[0]).Scan(&schemaExists); err != nil {
		return err
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgquote.Ident(t.Target[0])); err != nil {
			return err
		}
	}
	var defs []string
	for _, c := range t.Columns {
		def := pgquote.Ident(c.Name) + " " + c.Type
		if slices.Contains(t.Key, c.Name) {
			def += " NOT NULL"
		}
		defs = append(defs, def)
	}
	defs = append(defs,
		pgquote.Ident(t.LoadedColumn)+" timestamptz NOT NULL",
		pgquote.Ident(t.DeletedColumn)+" timestamptz",
		"PRIMARY KEY ("+pgquote.Idents(t.Key)+")")
	ddl := fmt.Sprintf("CREATE TABLE %s (\n    %s\n)", t.Target.Sanitize(), strings.Join(defs, ",\n    "))
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create the mirror (a source type the warehouse lacks must be created first, or the table by hand): %w", err)
	}
	return t.distribute(ctx, tx)
}

// distribute makes the mirror, just created, a Citus distributed table
// hashed by its first key column, in a colocation group of its own, when
// t.Distribute is set and the warehouse has the citus extension; it does
// nothing otherwise. A mirror that exists is left as it is: converting
// one copies all its rows.
//
// Changes never move a row between shards: a source update that changes
// a row's key is applied as a delete of the old key and an insert of the
// new one, and no statement sets a key column.
func (t *Table) distribute(ctx context.Context, tx pgx.Tx) error {
	if !t.Distribute {
		return nil
	}
	on, err := citus.Enabled(ctx, tx)
	if err != nil || !on {
		return err
	}
	return citus.Distribute(ctx, tx, t.Target.Sanitize(), t.Key[0], "")
}

func (t *Table) extend(ctx context.Context, tx pgx.Tx) error {
	cols, err := readColumns(ctx, tx.Conn(), t.Target)
	if err != nil {
		return err
	}
	have := map[string]string{}
	for _, c := range cols {
		have[c.Name] = c.Type
	}
	want := append(slices.Clone(t.Columns),
		Column{Name: t.LoadedColumn, Type: "timestamp with time zone"},
		Column{Name: t.DeletedColumn, Type: "timestamp with time zone"})
	for _, c := range want {
		typ, ok := have[c.Name]
		switch {
		case !ok:
			// A column the source gained since the mirror was made.
			ddl := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", t.Target.Sanitize(), pgquote.Ident(c.Name), c.Type)
			if c.Name == t.LoadedColumn {
				ddl += " NOT NULL DEFAULT now()"
			}
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return fmt.Errorf("add column %s: %w", c.Name, err)
			}
		case typ != c.Type:
			return fmt.Errorf("%w: column %s is %s in the mirror but %s at the source; alter one of them", ErrMirror, c.Name, typ, c.Type)
		}
	}
	var unique bool
	if err := tx.QueryRow(ctx, uniqueKeySQL, t.Target.Sanitize(), t.Key).Scan(&unique); err != nil {
		return err
	}
	if !unique {
		return fmt.Errorf("%w: no primary key or unique index on (%s); add one", ErrMirror, strings.Join(t.Key, ", "))
	}
	return nil
}

// KeyText is an SQL expression giving the key of the row alias as text:
// the column's text form for one key column, the row constructor's for
// several. Both sides of a comparison must use the same session settings
// (see SessionParams).
func KeyText(alias string, key []string) string {
	cols := make([]string, len(key))
	for i, k := range key {
		cols[i] = alias + "." + pgquote.Ident(k)
	}
	if len(cols) == 1 {
		return cols[0] + "::text"
	}
	return "ROW(" + strings.Join(cols, ", ") + ")::text"
}

// SessionParams are the settings under which values are turned into text
// on both the source and the warehouse, so that the same value prints the
// same on each.
var SessionParams = map[string]string{
	"timezone":           "UTC",
	"datestyle":          "ISO, MDY",
	"intervalstyle":      "postgres",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
}

// setLocalSQL sets every one of SessionParams for the current
// transaction, in one statement; setLocalArgs are its arguments, each
// name followed by its value.
var setLocalSQL, setLocalArgs = func() (string, []any) {
	names := slices.Sorted(maps.Keys(SessionParams))
	calls := make([]string, len(names))
	args := make([]any, 0, 2*len(names))
	for i, name := range names {
		calls[i] = fmt.Sprintf("set_config($%d, $%d, true)", 2*i+1, 2*i+2)
		args = append(args, name, SessionParams[name])
	}
	return "SELECT " + strings.Join(calls, ", "), args
}()

// SetLocal applies SessionParams to the transaction tx only, on a pooled
// connection whose session settings belong to others, in one round trip.
func SetLocal(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, setLocalSQL, setLocalArgs...); err != nil {
		return fmt.Errorf("set %s: %w", strings.Join(slices.Sorted(maps.Keys(SessionParams)), ", "), err)
	}
	return nil
}

// Connect opens a connection to a source database with SessionParams and
// the given application_name.
func Connect(ctx context.Context, dsn, app string) (*pgx.Conn, error) {
	cc, err := pgconnect.Parse(dsn, app)
	if err != nil {
		return nil, fmt.Errorf("source dsn: %w", err)
	}
	for k, v := range SessionParams {
		cc.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to source: %w", connerr.Explain(err))
	}
	return conn, nil
}
