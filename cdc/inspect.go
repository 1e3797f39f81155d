package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/mirror"
)

// inspectTimeout bounds each connection and query of Inspect.
const inspectTimeout = 10 * time.Second

// storedPositionSQL reads the position tidemark applied of a source, and
// the state of its snapshot.
const storedPositionSQL = `SELECT applied_lsn::text, snapshot FROM tidemark.cdc_positions WHERE source = $1`

// Inspection is what tidemark check finds of a CDC source: the checks the
// reader runs at start, and how the slot would fare in a failover.
type Inspection struct {
	Source string
	// Report is what Check found; Err the problems it found (wrapping
	// ErrSetup), or why the source could not be checked.
	Report Report
	Err    error
	// Position is what tidemark stored of the slot, 0 when nothing (or
	// when the warehouse was not asked, or the next start replaces the
	// slot); Snapshot the stored state of its snapshot ("" when none):
	// pending, done, skipped, or resync when tidemark resync --new-slot
	// asked for a new slot.
	Position pglogrepl.LSN
	Snapshot string
	// Standby is the copy of the slot on cdc.standby_dsn, nil without it;
	// StandbyErr why it could not be read.
	Standby    *StandbySlot
	StandbyErr error
	// Notes say how the slot fares in a failover and what to do.
	Notes []string
}

// Inspect checks the CDC source that c configures, as its reader does at
// start, and what a failover of the source would do to its slot. wh, when
// not nil, is the warehouse, whose stored position makes a missing slot a
// problem.
func Inspect(ctx context.Context, c Config, wh *pgxpool.Pool) Inspection {
	name := c.Source
	in := Inspection{Source: name}
	if wh != nil {
		pctx, cancel := context.WithTimeout(ctx, inspectTimeout)
		var applied string
		err := wh.QueryRow(pctx, storedPositionSQL, name).Scan(&applied, &in.Snapshot)
		cancel()
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			in.Err = fmt.Errorf("read the stored position: %w", err)
			return in
		case in.Snapshot == "pending" || in.Snapshot == snapshotResync:
			// The next start drops the slot and creates it again.
		default:
			if in.Position, err = pglogrepl.ParseLSN(applied); err != nil {
				in.Err = err
				return in
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	conn, err := mirror.Connect(cctx, c.DSN, "tidemark-check")
	if err != nil {
		in.Err = fmt.Errorf("sources.%s.cdc.dsn: %w", name, err)
		return in
	}
	defer pgconnect.Close(ctx, conn)
	specs := make([]pgx.Identifier, len(c.Tables))
	for i, t := range c.Tables {
		specs[i] = t.Source
	}
	in.Report, in.Err = Check(cctx, conn, CheckSpec{Source: name, Slot: c.Slot, Publication: c.Publication, Tables: specs,
		Position: in.Position, Failover: c.FailoverSlot, Replace: in.Snapshot == snapshotResync || in.Snapshot == "pending", Primary: c.PrimaryDSN != ""})
	if c.StandbyDSN != "" {
		in.Standby, in.StandbyErr = inspectStandby(ctx, c.StandbyDSN, c.Slot)
	}
	in.Notes = failoverNotes(c, in)
	return in
}

// inspectStandby reads the standby's copy of slot.
func inspectStandby(ctx context.Context, dsn, slot string) (*StandbySlot, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	conn, err := mirror.Connect(ctx, dsn, "tidemark-check")
	if err != nil {
		return nil, fmt.Errorf("cdc.standby_dsn: %w", err)
	}
	defer pgconnect.Close(ctx, conn)
	st, err := CheckStandby(ctx, conn, slot)
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// failoverNotes say how the source's slot fares in a failover of the
// source, and what to configure.
func failoverNotes(c Config, in Inspection) []string {
	r := in.Report
	if r.ServerVersion == 0 {
		return nil // not reached
	}
	var notes []string
	add := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	switch {
	case r.InRecovery:
		add("the source is a standby: the slot is decoded there, and a standby's slot cannot be a failover slot")
	case r.ServerVersion < failoverSlotsVersion:
		add("PostgreSQL %s has no failover slots: a failover of the source loses the slot, and the tables must be resynced with a new slot",
			versionText(r.ServerVersion))
	case c.FailoverSlot == config.FailoverOff:
		add("failover_slot: off: a failover of the source loses the slot")
	case r.Slot.Exists && !r.Slot.Failover:
		add("slot %s is not a failover slot yet: the reader makes it one when it next starts", c.Slot)
	}
	if !r.InRecovery && r.Slot.Failover && r.StandbySlots == "" {
		add("synchronized_standby_slots is not set on the source: the reader may apply changes no standby has received, " +
			"which a failover to that standby loses at the source but the mirrors keep; set it to the physical slots of the standbys that sync the slot")
	}
	if st := in.Standby; st != nil {
		switch {
		case !st.InRecovery:
			add("cdc.standby_dsn is not a standby (promoted?)")
		case !st.SyncSlots:
			add("the standby does not sync slots: set sync_replication_slots = on there (with hot_standby_feedback = on and a dbname in primary_conninfo)")
		case !st.HotStandbyFeedback:
			add("the standby runs without hot_standby_feedback, which syncing slots needs")
		case !st.Exists:
			add("the standby has no copy of slot %s yet: it syncs one once the slot has passed a running-transactions record (SELECT pg_log_standby_snapshot() on the source makes one)", c.Slot)
		case !st.Synced:
			add("the standby's slot %s is not a synced copy (created on the standby, or not yet persisted)", c.Slot)
		case st.Invalidated != "":
			add("the standby's copy of slot %s is invalidated (%s)", c.Slot, st.Invalidated)
		}
		if st.InRecovery && st.StandbySlots != "" {
			add("the standby's synchronized_standby_slots is %q (a copy of the primary's?): once it is promoted, every logical decoding there waits for those slots; "+
				"set it to '' on the standby, or to the slots of its own standbys", st.StandbySlots)
		}
	}
	return notes
}
