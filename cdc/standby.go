package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/mirror"
)

// A source may be a hot standby of PostgreSQL 16 or later (decoding on a
// standby): the slot is created, decoded and snapshotted there, and the
// primary carries no decoding. A standby cannot write, so what the reader
// writes on the source (the publication, heartbeats) goes to the primary
// that cdc.primary_dsn names; and creating a slot on a standby waits for a
// running-transactions record from the primary, which the reader asks the
// primary for (pg_log_standby_snapshot) while it waits.

// logStandbySnapshotSQL makes the primary write a running-transactions
// record, which a slot being created on a standby waits for.
const logStandbySnapshotSQL = `SELECT pg_log_standby_snapshot()`

// nudgeEvery is how often the primary is asked for a running-transactions
// record while the slot is created on a standby.
const nudgeEvery = 2 * time.Second

// writeDSN is where the reader writes on the source (the publication,
// heartbeats): the source itself, or the primary of a source that is a
// standby, "" when no primary is configured.
func (r *Reader) writeDSN(report Report) string {
	if report.InRecovery {
		return r.conf.PrimaryDSN
	}
	return r.conf.DSN
}

// createPublicationOnPrimary creates the publication of a source that is a
// standby on its primary and waits, within r.waitTimeout, until the standby has
// replayed it. Without cdc.primary_dsn it says what to run.
func (r *Reader) createPublicationOnPrimary(ctx context.Context, srcConn *pgx.Conn) error {
	conf := &r.conf
	if conf.PrimaryDSN == "" {
		return fmt.Errorf("%w: sources.%s.cdc.publication: publication %s does not exist, and %s is a standby, where it cannot be created: "+
			"run %s on the primary, or set sources.%s.cdc.primary_dsn to the primary",
			ErrSetup, r.conf.Source, conf.Publication, "sources."+r.conf.Source+".cdc.dsn", r.createPublicationStatement(), r.conf.Source)
	}
	pctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	primary, err := mirror.Connect(pctx, conf.PrimaryDSN, "tidemark-cdc")
	if err != nil {
		return fmt.Errorf("sources.%s.cdc.primary_dsn: %w", r.conf.Source, err)
	}
	defer pgconnect.Close(ctx, primary)
	if err := r.createPublication(ctx, primary); err != nil {
		return err
	}
	for {
		var all bool
		err := srcConn.QueryRow(pctx, checkPublicationSQL, conf.Publication).Scan(&all)
		if err == nil {
			return nil
		}
		if err != pgx.ErrNoRows {
			return fmt.Errorf("sources.%s.cdc.publication: read publication %s on the standby: %w", r.conf.Source, conf.Publication, err)
		}
		select {
		case <-pctx.Done():
			return fmt.Errorf("sources.%s.cdc.publication: the standby did not replay publication %s within %s: %w", r.conf.Source, conf.Publication, r.waitTimeout, pctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nudgePrimary asks the primary of a source that is a standby for a
// running-transactions record every nudgeEvery until stop closes, so that
// the slot's creation on the standby need not wait for the primary to
// write one itself. Failures are logged: the creation then waits longer.
func (r *Reader) nudgePrimary(ctx context.Context, stop <-chan struct{}) {
	if r.conf.PrimaryDSN == "" {
		r.log.Info("creating the replication slot on a standby waits for a running-transactions record from the primary; "+
			"without cdc.primary_dsn tidemark cannot ask for one (the primary writes one every 15 s while it is busy)", "slot", r.conf.Slot)
		return
	}
	conn, err := mirror.Connect(ctx, r.conf.PrimaryDSN, "tidemark-cdc")
	if err != nil {
		r.log.Warn("cannot ask the primary for a running-transactions record", "err", err)
		return
	}
	defer pgconnect.Close(ctx, conn)
	t := time.NewTicker(nudgeEvery)
	defer t.Stop()
	for {
		nctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
		_, err := conn.Exec(nctx, logStandbySnapshotSQL)
		cancel()
		if err != nil {
			r.log.Warn("cannot ask the primary for a running-transactions record", "err", err)
			return
		}
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
