package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// A mirror without a source catalog (a Debezium source's) is described by
// the warehouse's catalog when it exists, and created from the columns
// its change events declare when it does not.

// primaryKeySQL lists the columns of a table's primary key in key order;
// $1 is a quoted, qualified name.
const primaryKeySQL = `
SELECT a.attname
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)`

// ErrNoPrimaryKey means an existing mirror has no primary key to match
// changes by.
var ErrNoPrimaryKey = errors.New("mirror: no primary key")

// ReadTarget reads the columns and primary key of the mirror target from
// the warehouse catalog; exists is false when there is no such table.
func ReadTarget(ctx context.Context, conn *pgx.Conn, target pgx.Identifier) (cols []Column, key []string, exists bool, err error) {
	if err := conn.QueryRow(ctx, existsSQL, target.Sanitize()).Scan(&exists); err != nil || !exists {
		return nil, nil, false, err
	}
	if cols, err = readColumns(ctx, conn, target); err != nil {
		return nil, nil, true, fmt.Errorf("read the columns of %s: %w", target.Sanitize(), err)
	}
	rows, err := conn.Query(ctx, primaryKeySQL, target.Sanitize())
	if err != nil {
		return nil, nil, true, fmt.Errorf("read the primary key of %s: %w", target.Sanitize(), err)
	}
	if key, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, nil, true, fmt.Errorf("read the primary key of %s: %w", target.Sanitize(), err)
	}
	if len(key) == 0 {
		return nil, nil, true, fmt.Errorf("%w: %s has none; add one on the source table's key", ErrNoPrimaryKey, target.Sanitize())
	}
	return cols, key, true, nil
}

// EnsureTarget makes sure the mirror t.Target exists with at least the
// columns t.Columns (in the warehouse's types) and own, tidemark's
// columns: it creates the table with t.Key as primary key when missing
// (distributed when t.Distribute is set, as Ensure does), and adds the
// columns it lacks. The key columns must be among t.Columns.
func EnsureTarget(ctx context.Context, conn *pgx.Conn, t *Table, own []Column) error {
	target, cols, key := t.Target, t.Columns, t.Key
	for _, k := range key {
		if !slices.ContainsFunc(cols, func(c Column) bool { return c.Name == k }) {
			return fmt.Errorf("%w %s: key column %s is not among the columns %v", ErrMirror, target.Sanitize(), k, names(cols))
		}
	}
	for _, o := range own {
		if slices.ContainsFunc(cols, func(c Column) bool { return c.Name == o.Name }) {
			return fmt.Errorf("%w %s: the source has a column %s, which the mirror uses for itself; rename the mirror's column", ErrMirror, target.Sanitize(), o.Name)
		}
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockDDLSQL, target.Sanitize()); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, existsSQL, target.Sanitize()).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return t.createWith(ctx, tx, append(slices.Clone(cols), own...))
		}
		have, err := readColumns(ctx, tx.Conn(), target)
		if err != nil {
			return err
		}
		for _, c := range append(slices.Clone(cols), own...) {
			if slices.ContainsFunc(have, func(h Column) bool { return h.Name == c.Name }) {
				continue
			}
			ddl := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", target.Sanitize(), pgquote.Ident(c.Name), c.Type)
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return fmt.Errorf("add column %s to %s: %w", c.Name, target.Sanitize(), err)
			}
		}
		return nil
	})
}

// createWith creates the target with cols, the key's columns NOT NULL
// and its primary key.
func (t *Table) createWith(ctx context.Context, tx pgx.Tx, cols []Column) error {
	var schemaExists bool
	if err := tx.QueryRow(ctx, schemaExistsSQL, t.Target[0]).Scan(&schemaExists); err != nil {
		return err
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgquote.Ident(t.Target[0])); err != nil {
			return err
		}
	}
	defs := make([]string, 0, len(cols)+1)
	for _, c := range cols {
		def := pgquote.Ident(c.Name) + " " + c.Type
		if slices.Contains(t.Key, c.Name) || c.NotNull {
			def += " NOT NULL"
		}
		defs = append(defs, def)
	}
	defs = append(defs, "PRIMARY KEY ("+pgquote.Idents(t.Key)+")")
	ddl := fmt.Sprintf("CREATE TABLE %s (\n    %s\n)", t.Target.Sanitize(), strings.Join(defs, ",\n    "))
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create the mirror %s: %w", t.Target.Sanitize(), err)
	}
	return t.distribute(ctx, tx)
}

func names(cols []Column) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.Name
	}
	return out
}
