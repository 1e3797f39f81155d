package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

// SQL of creating and dropping the slot.
const (
	// terminateSlotHolderSQL ends the walsender of tidemark ($2, its
	// application_name) that holds slot $1: the session of an earlier
	// attempt at a snapshot, or at creating the slot, that the server has
	// not noticed is gone. A walsender waiting in CREATE_REPLICATION_SLOT
	// notices neither its client leaving nor the connection breaking, and
	// would finish making a slot nobody reads from.
	terminateSlotHolderSQL = `
SELECT count(pg_terminate_backend(s.active_pid))
FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = $1 AND a.application_name = $2`
	// watchSlotSQL is the state of the walsender creating the slot (pid
	// $1) and the oldest transaction with a transaction id open on the
	// source besides it, which the creation may be waiting for (NULLs
	// when the role may not see it).
	watchSlotSQL = `
SELECT a.state, a.wait_event_type, o.pid, extract(epoch FROM now() - o.xact_start)::float8
FROM pg_stat_activity a
LEFT JOIN LATERAL (
    SELECT pid, xact_start FROM pg_stat_activity
    WHERE backend_xid IS NOT NULL AND pid <> a.pid AND xact_start IS NOT NULL
    ORDER BY xact_start LIMIT 1) o ON true
WHERE a.pid = $1`
)

// replicationApp is the application_name of the reader's replication
// connection.
const replicationApp = "tidemark-cdc"

// slotWaitLogEvery is how often, at most, the reader logs that creating
// the slot waits for transactions open on the source.
const slotWaitLogEvery = time.Minute

// execStep runs sql on the warehouse pool, waiting at most r.waitTimeout.
func (r *Reader) execStep(ctx context.Context, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	return execDurable(ctx, r.pool, sql, args...)
}

// dropUnfinishedSlot drops the slot of a snapshot that did not finish, of
// a creation that did not (tidemark created it and has read nothing from
// it), or that tidemark resync --new-slot replaces. A walsender of tidemark still holding it is ended first: that
// of a replication connection given up on behind a stalled network lives
// on at the server until its TCP keepalives find the client gone, and a
// drop would wait for it that long. Each wait is bounded by r.waitTimeout.
func (r *Reader) dropUnfinishedSlot(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn) error {
	slot := r.conf.Slot
	tctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	var ended int64
	err := src.QueryRow(tctx, terminateSlotHolderSQL, slot, replicationApp).Scan(&ended)
	cancel()
	switch {
	case pgerr.Refused(err):
		// Refused (a holder of another role, say): the drop below
		// waits for it, within its bound.
		r.log.Warn("cannot end the session holding the slot of an unfinished snapshot or of a slot replaced", "slot", slot, "err", err)
	case err != nil:
		return fmt.Errorf("end the session holding the slot of an unfinished snapshot or of a slot replaced: %w", err)
	case ended > 0:
		r.log.Info("ended the earlier session holding the slot of an unfinished snapshot or of a slot replaced", "slot", slot)
	}
	// WAIT: the ended session releases the slot as it exits. A slot
	// still being created when its session ended is gone with it.
	dctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	err = pglogrepl.DropReplicationSlot(dctx, repl, slot, pglogrepl.DropReplicationSlotOptions{Wait: true})
	cancel()
	if err != nil && !pgerr.UndefinedObject(err) {
		return fmt.Errorf("drop the slot of an unfinished snapshot or of a slot replaced: %w", err)
	}
	return nil
}

// newSlot creates the slot (createSlotWatched), exporting its snapshot
// when export is set, and returns its consistent point. A statement the
// source refuses is a setup the reader cannot use (ErrSetup); the others
// are retried with the run.
func (r *Reader) newSlot(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn, export bool, report Report) (pglogrepl.CreateReplicationSlotResult, pglogrepl.LSN, error) {
	res, err := r.createSlotWatched(ctx, repl, src, export, report)
	if err != nil && (errors.Is(err, pgconnect.ErrNoProgress) || !pgerr.Refused(err)) {
		// The server stopped confirming progress, or could not run
		// the statement: retry.
		return res, 0, fmt.Errorf("sources.%s.cdc.slot: create slot %s: %w", r.conf.Source, r.conf.Slot, err)
	}
	if err != nil {
		return res, 0, fmt.Errorf("%w: sources.%s.cdc.slot: create slot %s: %w", ErrSetup, r.conf.Source, r.conf.Slot, err)
	}
	at, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	return res, at, err
}

// createSlotWatched creates the slot on repl with snapshot action action.
//
// CREATE_REPLICATION_SLOT waits for the transactions open on the source
// to end, legitimately for as long as they last, and says nothing
// meanwhile: a deadline on the call would fail a legitimate wait, and no
// deadline would wait for good behind a stalled network. So while it
// runs, every r.waitTimeout/4 a query on src (an ordinary connection) checks in
// pg_stat_activity that the walsender doing it is still active, and a
// watchdog of r.waitTimeout is touched each time it is. When the server stops
// confirming progress, or the query fails or stalls itself, the watchdog
// ends the creation, with ErrNoProgress. The walsender left behind, if
// the server is unreachable, is ended by the next start before it drops
// the slot (see dropUnfinishedSlot); a reachable server cancels the
// creation at once, on the cancel request of the abandoned call, and an
// interrupted creation leaves no slot.
func (r *Reader) createSlotWatched(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn, export bool, report Report) (pglogrepl.CreateReplicationSlotResult, error) {
	wctx, wd := pgconnect.WithWatchdog(ctx, r.waitTimeout)
	defer wd.Stop()
	stop := make(chan struct{})
	watched := make(chan error, 1)
	go func() { watched <- r.watchSlotCreation(wctx, src, repl.PID(), wd, stop) }()
	if report.InRecovery {
		nudged := make(chan struct{})
		go func() { defer close(nudged); r.nudgePrimary(wctx, stop) }()
		defer func() { <-nudged }()
	}
	res, err := sendCreateSlot(wctx, repl, r.conf.Slot, export, wantsFailover(r.conf.FailoverSlot, report), report.ServerVersion)
	// The watch ends its query, if one is under way, before src is
	// used again; the watchdog bounds that query.
	close(stop)
	werr := <-watched
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			err = fmt.Errorf("%w: %w", context.Cause(wctx), err)
			if werr != nil {
				err = fmt.Errorf("%w (%w)", err, werr)
			}
		}
		return res, err
	}
	if src.IsClosed() {
		// The watch's query was given up on after the creation had
		// succeeded: the slot stays pending, and the next start drops
		// it.
		return res, fmt.Errorf("watch the slot's creation: %w", werr)
	}
	return res, nil
}

// watchSlotCreation checks every r.waitTimeout/4 on src that the walsender pid
// creating the slot is active, and touches wd each time it is, until stop
// is closed or ctx ends. It returns at the first check that fails, with
// why, and wd then fires. While the walsender waits for a lock (for the
// transactions open on the source) it logs so, at most once per
// slotWaitLogEvery.
func (r *Reader) watchSlotCreation(ctx context.Context, src *pgx.Conn, pid uint32, wd *pgconnect.Watchdog, stop <-chan struct{}) error {
	started := time.Now()
	t := time.NewTicker(r.waitTimeout / 4)
	defer t.Stop()
	var logged time.Time
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var (
			state, waitType *string
			oldest          *int64
			age             *float64
		)
		err := src.QueryRow(ctx, watchSlotSQL, int64(pid)).Scan(&state, &waitType, &oldest, &age)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("the walsender creating the slot (pid %d) is gone", pid)
		}
		if err != nil {
			return fmt.Errorf("watch the slot's creation: %w", err)
		}
		if state == nil || *state != "active" {
			s := "unknown"
			if state != nil {
				s = *state
			}
			return fmt.Errorf("the walsender creating the slot (pid %d) is %s, not active", pid, s)
		}
		wd.Touch()
		if r.opts.creationWatched != nil {
			r.opts.creationWatched(pid, time.Since(started))
		}
		if waitType == nil || *waitType != "Lock" || time.Since(logged) < slotWaitLogEvery {
			continue
		}
		logged = time.Now()
		attrs := []any{"slot", r.conf.Slot, "waited", time.Since(started).Round(100 * time.Millisecond)}
		if oldest != nil && age != nil {
			attrs = append(attrs, "oldest_pid", *oldest, "oldest_age", time.Duration(*age*float64(time.Second)).Round(100*time.Millisecond))
		}
		r.log.Info("creating the replication slot waits for transactions open on the source", attrs...)
	}
}
