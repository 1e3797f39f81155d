package cdc

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/mirror"
)

// snapshot copies every tracked table, as of the snapshot the new slot
// exported, into its mirror, in ONE warehouse transaction that also marks
// the snapshot done. A mirror's earlier rows are removed first: a
// snapshot replaces what a mirror held.
func (r *Reader) snapshot(ctx context.Context, name string, tables map[string]*table) error {
	src, err := mirror.Connect(ctx, r.src.CDC.DSN, "tidemark-cdc-snapshot")
	if err != nil {
		return err
	}
	defer src.Close(context.WithoutCancel(ctx))
	stx, err := src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() { _ = stx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := stx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+literal(name)); err != nil {
		return fmt.Errorf("use the slot's snapshot: %w", err)
	}
	wh, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer wh.Release()
	tx, err := wh.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	loaded := r.now().UTC().Format("2006-01-02 15:04:05.999999") + "+00"
	for _, id := range r.specs {
		t := tables[id[0]+"."+id[1]]
		m := t.mirror
		cols := mirror.QuoteAll(m.ColumnNames())
		if _, err := tx.Exec(ctx, "DELETE FROM "+m.Target.Sanitize()); err != nil {
			return err
		}
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := src.PgConn().CopyTo(ctx, pw, fmt.Sprintf("COPY (SELECT %s, %s::timestamptz FROM %s) TO STDOUT", cols, literal(loaded), id.Sanitize()))
			pw.CloseWithError(err)
			done <- err
		}()
		tag, err := tx.Conn().PgConn().CopyFrom(ctx, pr, fmt.Sprintf("COPY %s (%s, %s) FROM STDIN", m.Target.Sanitize(), cols, quote(m.LoadedColumn)))
		_ = pr.CloseWithError(err)
		if serr := <-done; err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", t.name, err)
		}
		r.log.Info("snapshot copied", "table", t.name, "rows", tag.RowsAffected())
	}
	if _, err := tx.Exec(ctx, snapshotDoneSQL, r.src.Name, r.now()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// mirrorColumn describes a column added to a mirror.
func mirrorColumn(name, typ string) mirror.Column { return mirror.Column{Name: name, Type: typ} }
