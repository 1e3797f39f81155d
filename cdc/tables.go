package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
)

// The tables a reader takes on while its source runs.
//
// tidemark.cdc_positions.tables holds the tables of cdc.tables that the
// reader streamed at its last start. A table named since (added to
// cdc.tables, or named again after it was left out) is added to the
// publication if the publication lacks it, before the stream starts, and
// resynced while the stream goes on: the stream applies its changes from
// the first position it reads, and the resync copies what came before and
// makes the mirror whole. The other tables' mirrors are not touched.
//
// A slot replaced by tidemark resync --new-slot (snapshot state
// snapshotResync) is dropped and created again without a snapshot; the
// reader streams from the new slot's consistent point and resyncs every
// table. The changes between the old position and the new slot are
// missing from the raw change table: tidemark.cdc_gaps records them.

// snapshotResync is the snapshot state of a source whose slot is replaced
// (tidemark resync --new-slot).
const snapshotResync = "resync"

// SQL of the tables a reader takes on.
const (
	storedTablesSQL  = `SELECT tables FROM tidemark.cdc_positions WHERE source = $1`
	snapshotStateSQL = `SELECT snapshot FROM tidemark.cdc_positions WHERE source = $1`
	storeTablesSQL   = `UPDATE tidemark.cdc_positions SET tables = $2 WHERE source = $1`
	// restartResyncSQL asks for a resync of a table from its first row,
	// as a new generation, unless one is asked for and not begun: a
	// resync under way when the stream missed changes (the table was not
	// streamed, or the slot was replaced) would keep chunks that lack
	// them. No row when one is pending.
	restartResyncSQL     = newResyncSQL + `WHERE r.state <> 'pending' RETURNING generation`
	dropOldResyncKeysSQL = `DELETE FROM tidemark.cdc_resync_keys WHERE source = $1 AND source_table = $2 AND generation < $3`
	addToPublicationSQL  = `ALTER PUBLICATION %s ADD TABLE %s`
	// lockTablesSQL holds off the writers of the tables added to the
	// publication until the statement commits (see addToPublication),
	// waiting at most lockForPublicationSQL's milliseconds for those
	// under way.
	lockTablesSQL         = `LOCK TABLE %s IN SHARE MODE`
	lockForPublicationSQL = `SET LOCAL lock_timeout = %d`
	// slotReplacedSQL stores the consistent point of a slot that
	// replaced a lost one, and the tables streamed from it.
	slotReplacedSQL = `
UPDATE tidemark.cdc_positions SET slot = $2, system_id = $3, slot_created_lsn = $4::pg_lsn, applied_lsn = $4::pg_lsn,
    confirmed_lsn = $4::pg_lsn, snapshot = 'done', tables = $5, updated_at = $6
WHERE source = $1`
	gapClosedSQL = `
UPDATE tidemark.cdc_gaps SET resumed_system_id = $2, resumed_lsn = $3::pg_lsn, resumed_at = $4
WHERE source = $1 AND resumed_lsn IS NULL`
	// requestNewSlotSQL records the gap that a new slot leaves and asks
	// the reader for the slot; no row when the source has no position or
	// a new slot is asked for already.
	requestNewSlotSQL = `
WITH asked AS (
    UPDATE tidemark.cdc_positions SET snapshot = 'resync', updated_at = $2
    WHERE source = $1 AND snapshot IN ('done', 'skipped')
    RETURNING source, slot, system_id, applied_lsn, last_commit_time
)
INSERT INTO tidemark.cdc_gaps (source, recorded_at, recorded_by, slot, system_id, applied_lsn, last_commit_time)
SELECT source, $2, $3, slot, system_id, applied_lsn, last_commit_time FROM asked
RETURNING applied_lsn::text`
)

// resyncUnpublished asks for the resync of tracked tables the publication
// does not publish, before the reader (or an operator) adds them: their
// changes until then are not in the slot, and once they are published a
// start no longer sees that they were not.
func (r *Reader) resyncUnpublished(ctx context.Context, tables []pgx.Identifier) error {
	var names []string
	for _, t := range tables {
		names = append(names, t[0]+"."+t[1])
	}
	tctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	return pgx.BeginFunc(tctx, r.pool, func(tx pgx.Tx) error {
		return r.restartResyncs(tctx, tx, names, "tidemark: added to "+r.conf.Source+".cdc.tables")
	})
}

// addToPublication adds the tables the publication lacks (report's
// Unpublished) to it, on the source or, for a standby, on its primary,
// before the stream starts: the tables' changes are sent from the
// statement's commit on. The tables are locked against writes (SHARE) in
// the statement's transaction: a transaction writing a table before the
// statement and committing after it would make pgoutput take the table
// for unpublished until something else invalidates its cache (a bug of
// PostgreSQL releases before May 2025), and its changes would be lost.
func (r *Reader) addToPublication(ctx context.Context, src *pgx.Conn, report Report) error {
	var quoted []string
	for _, t := range report.Unpublished {
		quoted = append(quoted, t.Sanitize())
	}
	stmt := fmt.Sprintf(addToPublicationSQL, pgquote.Ident(r.conf.Publication), strings.Join(quoted, ", "))
	conn := src
	if report.InRecovery {
		// Check refuses a standby without cdc.primary_dsn.
		primary, err := mirror.Connect(ctx, r.conf.PrimaryDSN, "tidemark-cdc")
		if err != nil {
			return fmt.Errorf("sources.%s.cdc.primary_dsn: %w", r.conf.Source, err)
		}
		defer pgconnect.Close(ctx, primary)
		conn = primary
	}
	pctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	err := pgx.BeginFunc(pctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(pctx, fmt.Sprintf(lockForPublicationSQL, r.waitTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(pctx, fmt.Sprintf(lockTablesSQL, strings.Join(quoted, ", "))); err != nil {
			return err
		}
		_, err := tx.Exec(pctx, stmt)
		return err
	})
	if pgerr.Refused(err) && !pgerr.Retryable(err) && pgerr.Code(err) != pgerrcode.LockNotAvailable {
		// Refused for good (the role owns neither): a lock not had in
		// time is tried again with the run.
		return fmt.Errorf("%w: sources.%s.cdc.tables: %s: %w", ErrSetup, r.conf.Source, stmt, err)
	}
	if err != nil {
		return fmt.Errorf("sources.%s.cdc.tables: %s: %w", r.conf.Source, stmt, err)
	}
	r.log.Info("added tables to the publication", "publication", r.conf.Publication, "tables", strings.Join(quoted, ", "))
	if !report.InRecovery {
		return nil
	}
	// WAIT: the standby replays the statement; bounded by r.waitTimeout.
	for {
		var n int
		if err := src.QueryRow(pctx, countPublishedSQL, r.conf.Publication, quoted).Scan(&n); err != nil {
			return fmt.Errorf("sources.%s.cdc.tables: the standby did not replay %s: %w", r.conf.Source, stmt, err)
		}
		if n == len(quoted) {
			return nil
		}
		select {
		case <-pctx.Done():
			return fmt.Errorf("sources.%s.cdc.tables: the standby did not replay %s within %s: %w", r.conf.Source, stmt, r.waitTimeout, pctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// countPublishedSQL counts the tables (quoted names) the publication
// publishes.
const countPublishedSQL = `
SELECT count(*) FROM pg_publication_tables
WHERE pubname = $1 AND format('%I.%I', schemaname, tablename) = ANY ($2::text[])`

// tableNames are the names of the tables of cdc.tables, as the resyncs
// name them (schema.table).
func (r *Reader) tableNames() []string {
	var out []string
	for _, t := range r.specs {
		out = append(out, t[0]+"."+t[1])
	}
	return out
}

// takeOnTables asks for the resync of the tables cdc.tables names that
// the reader did not stream at its last start, and stores the tables it
// streams. fresh reports a slot created by this start, whose snapshot (if
// any) copied every table. Those the publication lacked were asked for
// already (resyncUnpublished). Stored NULL, as a release before left it,
// takes the tables as streamed.
func (r *Reader) takeOnTables(ctx context.Context, fresh bool) error {
	names := r.tableNames()
	stored, err := StreamedTables(ctx, r.pool, r.conf.Source)
	if err != nil {
		return err
	}
	var take []string
	for _, n := range names {
		if !fresh && stored != nil && !slices.Contains(stored, n) {
			take = append(take, n)
		}
	}
	if len(take) == 0 && slices.Equal(stored, names) {
		return nil
	}
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := r.restartResyncs(ctx, tx, take, "tidemark: added to "+r.conf.Source+".cdc.tables"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, storeTablesSQL, r.conf.Source, names); err != nil {
			return fmt.Errorf("store the tables streamed: %w", err)
		}
		for _, t := range take {
			r.log.Info("taking on a table the reader did not stream: copying it while the stream goes on", "table", t)
		}
		return nil
	})
}

// restartResyncs asks, in tx, for a resync of each table from its first
// row (see restartResyncSQL), dropping the keys of the resyncs before.
func (r *Reader) restartResyncs(ctx context.Context, tx pgx.Tx, tables []string, by string) error {
	for _, t := range tables {
		var gen int64
		err := tx.QueryRow(ctx, restartResyncSQL, r.conf.Source, t, r.now(), by).Scan(&gen)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // pending: it starts from the first row
		}
		if err != nil {
			return fmt.Errorf("request the resync of %s: %w", t, err)
		}
		if _, err := tx.Exec(ctx, dropOldResyncKeysSQL, r.conf.Source, t, gen); err != nil {
			return fmt.Errorf("request the resync of %s: %w", t, err)
		}
	}
	return nil
}

// replaceSlot drops the source's slot, if it exists, creates a new one
// without a snapshot, and, in one durable warehouse transaction, moves
// the position to its consistent point, closes the gap recorded by
// tidemark resync --new-slot, and asks for the resync of every table. A
// crash before that transaction leaves the state as it was: the next
// start replaces the slot again.
func (r *Reader) replaceSlot(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn, report Report) (position, error) {
	if report.Slot.Exists {
		if err := r.dropUnfinishedSlot(ctx, repl, src); err != nil {
			return position{}, err
		}
	}
	_, at, err := r.newSlot(ctx, repl, src, false, report)
	if err != nil {
		return position{}, err
	}
	names := r.tableNames()
	tctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	err = pgx.BeginFunc(tctx, r.pool, func(tx pgx.Tx) error {
		if err := durable(tctx, tx); err != nil {
			return err
		}
		now := r.now()
		tag, err := tx.Exec(tctx, slotReplacedSQL, r.conf.Source, r.conf.Slot, report.SystemID, at.String(), names, now)
		if err != nil {
			return fmt.Errorf("store the position: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("store the position: the position of %s is gone", r.conf.Source)
		}
		if _, err := tx.Exec(tctx, gapClosedSQL, r.conf.Source, report.SystemID, at.String(), now); err != nil {
			return fmt.Errorf("record the gap: %w", err)
		}
		return r.restartResyncs(tctx, tx, names, "tidemark: new slot")
	})
	if err != nil {
		return position{}, err
	}
	r.log.Warn("replaced the replication slot: every table is resynced while the stream goes on; tidemark.cdc_gaps records the changes missing from the raw change table",
		"slot", r.conf.Slot, "consistent_point", at)
	return position{exists: true, systemID: report.SystemID, snapshot: "done", applied: at, confirmed: at}, nil
}

// NewSlot is what RequestNewSlot did.
type NewSlot struct {
	// Asked reports a new slot asked for now; Applied is then the
	// position applied before the gap.
	Asked   bool
	Applied pglogrepl.LSN
	// State is the source's snapshot state when nothing was asked for:
	// "" without a stored position, "resync" when a new slot is asked
	// for already, "pending" while a snapshot is taken.
	State string
}

// RequestNewSlot asks the readers of source to replace its slot (lost,
// dropped, or missing after a failover) with a new one and resync every
// table, recording in tidemark.cdc_gaps the gap in the raw change table
// that follows. A reader streaming the source ends its run within seconds
// and replaces the slot as it starts again.
func RequestNewSlot(ctx context.Context, db Querier, source, by string, now time.Time) (NewSlot, error) {
	var (
		ns      NewSlot
		applied string
	)
	err := db.QueryRow(ctx, requestNewSlotSQL, source, now, by).Scan(&applied)
	if errors.Is(err, pgx.ErrNoRows) {
		err = db.QueryRow(ctx, snapshotStateSQL, source).Scan(&ns.State)
		if errors.Is(err, pgx.ErrNoRows) {
			return ns, nil
		}
		if err != nil {
			return ns, fmt.Errorf("ask for a new slot for %s: %w", source, err)
		}
		return ns, nil
	}
	if err != nil {
		return ns, fmt.Errorf("ask for a new slot for %s: %w", source, err)
	}
	ns.Asked = true
	ns.Applied, err = pglogrepl.ParseLSN(applied)
	return ns, err
}

// errNewSlot ends a run of the reader when a new slot is asked for: the
// next run replaces the slot.
var errNewSlot = errors.New("tidemark resync --new-slot asked for a new slot: starting again to replace it")

// newSlotAsked reports whether tidemark resync --new-slot asked for a new
// slot for the source.
func (r *Reader) newSlotAsked(ctx context.Context) (bool, error) {
	var state string
	err := r.pool.QueryRow(ctx, snapshotStateSQL, r.conf.Source).Scan(&state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("read the stored position: %w", err)
	}
	return state == snapshotResync, nil
}
