package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
)

// SQL of Unpublish.
const (
	// dropFromPublicationSQL drops tables (quoted names) from a
	// publication.
	dropFromPublicationSQL = `ALTER PUBLICATION %s DROP TABLE %s`
	inRecoverySQL          = `SELECT pg_is_in_recovery()`
)

// ErrUnpublish is the error of an Unpublish that the source's state
// refuses: a publication FOR ALL TABLES, a table named that it does not
// publish, or a source that is a standby without cdc.primary_dsn.
var ErrUnpublish = errors.New("cannot drop from the publication")

// Unpublished is what Unpublish did, or would do.
type Unpublished struct {
	// Statement is the ALTER PUBLICATION run (or to run); "" when there
	// is nothing to drop.
	Statement string
	// Tables are the tables dropped, as schema.table.
	Tables []string
}

// Unpublish drops tables from the publication of the CDC source c: the
// tables named (schema.table), or, with none, every table the publication
// publishes that c's tables do not name. Naming a table c's tables name is
// the caller's error to refuse; a table of streamed (the tables the
// source's reader streamed at its last start, StreamedTables) is refused
// here: a reader running with another configuration would lose its
// changes. With dryRun it only says what it would run. The reader applies
// nothing of a table it does not track; dropping it from the publication
// stops the source sending its changes. Its mirror and raw change rows
// are kept.
func Unpublish(ctx context.Context, c Config, tables, streamed []string, dryRun bool) (Unpublished, error) {
	var out Unpublished
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	conn, err := mirror.Connect(ctx, c.DSN, "tidemark-unpublish")
	if err != nil {
		return out, fmt.Errorf("sources.%s.cdc.dsn: %w", c.Source, err)
	}
	defer pgconnect.Close(ctx, conn)
	published, idents, all, err := publishedTables(ctx, conn, c.Publication)
	if err != nil {
		return out, err
	}
	if all {
		return out, fmt.Errorf("%w: publication %s publishes all tables: it cannot drop one; create one FOR TABLE the tables of sources.%s.cdc.tables instead",
			ErrUnpublish, c.Publication, c.Source)
	}
	if len(tables) == 0 {
		for _, p := range published {
			if !slices.ContainsFunc(c.Tables, func(t Table) bool { return t.Source[0]+"."+t.Source[1] == p }) {
				tables = append(tables, p)
			}
		}
	}
	var quoted []string
	for _, t := range tables {
		if !slices.Contains(published, t) {
			return out, fmt.Errorf("%w: publication %s does not publish %s", ErrUnpublish, c.Publication, t)
		}
		if slices.Contains(streamed, t) {
			return out, fmt.Errorf("%w: the reader of %s streamed %s at its last start (tidemark.cdc_positions.tables): "+
				"restart the readers with it removed from sources.%s.cdc.tables first", ErrUnpublish, c.Source, t, c.Source)
		}
		quoted = append(quoted, pgquote.Ident(idents[t][0], idents[t][1]))
	}
	if len(quoted) == 0 {
		return out, nil
	}
	out.Tables = tables
	out.Statement = fmt.Sprintf(dropFromPublicationSQL, pgquote.Ident(c.Publication), strings.Join(quoted, ", "))
	if dryRun {
		return out, nil
	}
	var standby bool
	if err := conn.QueryRow(ctx, inRecoverySQL).Scan(&standby); err != nil {
		return out, fmt.Errorf("sources.%s.cdc.dsn: %w", c.Source, err)
	}
	if standby {
		if c.PrimaryDSN == "" {
			return out, fmt.Errorf("%w: the source is a standby: run %s on its primary, or set sources.%s.cdc.primary_dsn", ErrUnpublish, out.Statement, c.Source)
		}
		primary, err := mirror.Connect(ctx, c.PrimaryDSN, "tidemark-unpublish")
		if err != nil {
			return out, fmt.Errorf("sources.%s.cdc.primary_dsn: %w", c.Source, err)
		}
		defer pgconnect.Close(ctx, primary)
		conn = primary
	}
	if _, err := conn.Exec(ctx, out.Statement); err != nil {
		return out, fmt.Errorf("%s: %w", out.Statement, err)
	}
	return out, nil
}

// publishedTables reads the tables the publication publishes, as
// schema.table, each with its schema and name, and whether it is FOR ALL
// TABLES.
func publishedTables(ctx context.Context, conn *pgx.Conn, publication string) ([]string, map[string][2]string, bool, error) {
	var all bool
	err := conn.QueryRow(ctx, checkPublicationSQL, publication).Scan(&all)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, false, fmt.Errorf("%w: publication %s does not exist", ErrUnpublish, publication)
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("read publication %s: %w", publication, err)
	}
	rows, err := conn.Query(ctx, checkPublicationTablesSQL, publication)
	if err != nil {
		return nil, nil, false, fmt.Errorf("read the tables of publication %s: %w", publication, err)
	}
	var out []string
	idents := map[string][2]string{}
	var schema, name string
	_, err = pgx.ForEachRow(rows, []any{&schema, &name}, func() error {
		out = append(out, schema+"."+name)
		idents[schema+"."+name] = [2]string{schema, name}
		return nil
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("read the tables of publication %s: %w", publication, err)
	}
	slices.Sort(out)
	return out, idents, all, nil
}

// StreamedTables returns the tables (schema.table) the reader of source
// streamed at its last start; none before a reader stored them.
func StreamedTables(ctx context.Context, db Querier, source string) ([]string, error) {
	var out []string
	err := db.QueryRow(ctx, storedTablesSQL, source).Scan(&out)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the tables streamed: %w", err)
	}
	return out, nil
}
