package cdc

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// A failover slot (PostgreSQL 17 and later) is copied by the standbys that
// sync replication slots (sync_replication_slots = on), so that after a
// failover the promoted standby has the slot, confirmed no further than
// the reader confirmed it: the reader resumes from its own stored
// position. With cdc.failover_slot auto (the default) the reader creates
// its slot as one, and makes an existing slot one, on a primary of 17 or
// later; a slot created on a standby cannot be one.

// failoverSlotsVersion is the first server_version_num with failover
// slots.
const failoverSlotsVersion = 170000

// SQL of the failover slot and of a standby.
const (
	// standbySlotSQL reads, on a standby, its copy of a slot and how far
	// it replayed.
	standbySlotSQL = `
SELECT s.synced, coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.invalidation_reason, ''),
       coalesce(pg_last_wal_replay_lsn()::text, ''), pg_is_in_recovery(),
       current_setting('sync_replication_slots'), current_setting('hot_standby_feedback'),
       current_setting('synchronized_standby_slots')
FROM (SELECT 1) AS one
LEFT JOIN pg_replication_slots s ON s.slot_name = $1`
)

// decodeOnStandbyVersion is the first server_version_num that decodes on
// a standby.
const decodeOnStandbyVersion = 160000

// readServer reads the source's version and whether it is a standby, and
// checks that a standby can decode: 16 or later, with hot_standby_feedback
// (without it, the primary's vacuum invalidates the slot).
func (c *checker) readServer(ctx context.Context) error {
	var feedback string
	if err := c.conn.QueryRow(ctx, checkServerSQL).Scan(&c.report.ServerVersion, &c.report.InRecovery, &feedback); err != nil {
		return fmt.Errorf("cdc check: read the server's version: %w", err)
	}
	switch {
	case !c.report.InRecovery:
	case c.report.ServerVersion < decodeOnStandbyVersion:
		c.problem("%s: names a standby of PostgreSQL %s, which cannot decode changes (16 or later can): point it at the primary",
			c.key("dsn"), versionText(c.report.ServerVersion))
	case feedback != "on":
		c.problem("%s: names a standby that runs without hot_standby_feedback, so the primary's vacuum would invalidate the slot: "+
			"set hot_standby_feedback = on on the standby (and have it stream through a physical slot of the primary)", c.key("dsn"))
	}
	if c.spec.Failover != config.FailoverOn {
		return nil
	}
	switch {
	case c.report.ServerVersion < failoverSlotsVersion:
		c.problem("%s: on, but the source runs PostgreSQL %s, and failover slots need 17 or later: set it to auto or off, or upgrade the source",
			c.key("failover_slot"), versionText(c.report.ServerVersion))
	case c.report.InRecovery:
		c.problem("%s: on, but %s is a standby, where a slot cannot be a failover slot: point it at the primary, or set failover_slot to auto or off",
			c.key("failover_slot"), c.key("dsn"))
	}
	return nil
}

// versionText is a server_version_num as a version: 170002 is 17.2.
func versionText(num int) string {
	return strconv.Itoa(num/10000) + "." + strconv.Itoa(num%10000)
}

// wantsFailover reports whether the slot is to be a failover slot: asked
// for (failover_slot auto or on) and possible (a primary of 17 or later).
func wantsFailover(setting string, report Report) bool {
	return setting != config.FailoverOff && report.ServerVersion >= failoverSlotsVersion && !report.InRecovery
}

// createSlotSQL is the CREATE_REPLICATION_SLOT command of a logical
// pgoutput slot, its snapshot exported ("export") or not ("nothing"), as
// a failover slot when failover is set. The option list is the syntax of
// PostgreSQL 15 and later; pglogrepl writes the older one, which has no
// FAILOVER, and its ParseCreateReplicationSlot reads the answer of both.
func createSlotSQL(slot, snapshot string, failover bool) string {
	opts := []string{"SNAPSHOT '" + snapshot + "'"}
	if failover {
		opts = append(opts, "FAILOVER true")
	}
	return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (%s)", pgquote.Ident(slot), strings.Join(opts, ", "))
}

// sendCreateSlot runs CREATE_REPLICATION_SLOT on the replication
// connection repl: in the option syntax on PostgreSQL 15 and later (the
// one with FAILOVER), in pglogrepl's older one on 14.
func sendCreateSlot(ctx context.Context, repl *pgconn.PgConn, slot string, export, failover bool, version int) (pglogrepl.CreateReplicationSlotResult, error) {
	if version < 150000 {
		action := "NOEXPORT_SNAPSHOT"
		if export {
			action = "EXPORT_SNAPSHOT"
		}
		return pglogrepl.CreateReplicationSlot(ctx, repl, slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: action})
	}
	snapshot := "nothing"
	if export {
		snapshot = "export"
	}
	return pglogrepl.ParseCreateReplicationSlot(repl.Exec(ctx, createSlotSQL(slot, snapshot, failover)))
}

// alterSlotFailoverSQL makes a slot a failover slot (PostgreSQL 17 and
// later), a replication command pglogrepl does not have.
func alterSlotFailoverSQL(slot string) string {
	return fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgquote.Ident(slot))
}

// makeFailover makes the existing slot a failover slot when it is to be
// one and is not, on the replication connection repl, before the stream
// starts. A slot another session still holds (the walsender of a reader
// that stopped, not yet noticed gone) cannot be altered: that is logged,
// and tried again at the next start.
func (r *Reader) makeFailover(ctx context.Context, repl *pgconn.PgConn, report Report) error {
	if !report.Slot.Exists || report.Slot.Failover || !wantsFailover(r.conf.FailoverSlot, report) {
		return nil
	}
	slot := r.conf.Slot
	actx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	_, err := repl.Exec(actx, alterSlotFailoverSQL(slot)).ReadAll()
	cancel()
	switch {
	case err == nil:
		r.log.Info("made the replication slot a failover slot", "slot", slot)
		return nil
	case pgerr.ObjectInUse(err):
		r.log.Warn("cannot make the replication slot a failover slot while another session holds it; trying again at the next start", "slot", slot, "err", err)
		return nil
	case pgerr.Refused(err):
		return fmt.Errorf("%w: sources.%s.cdc.failover_slot: make slot %s a failover slot: %w (set failover_slot: off to leave it as it is)", ErrSetup, r.conf.Source, slot, err)
	}
	return fmt.Errorf("sources.%s.cdc.slot: make slot %s a failover slot: %w", r.conf.Source, slot, err)
}

// StandbySlot is what a standby of the source holds of the slot.
type StandbySlot struct {
	// InRecovery is false when the server named is not a standby (it was
	// promoted).
	InRecovery bool
	// Exists reports that the standby has the slot; Synced that it is a
	// copy the standby syncs; Invalidated why it was invalidated, "" if
	// not.
	Exists, Synced bool
	Invalidated    string
	// Confirmed is the standby's copy's confirmed position, Replayed how
	// far the standby replayed.
	Confirmed, Replayed pglogrepl.LSN
	// SyncSlots and HotStandbyFeedback are its sync_replication_slots
	// and hot_standby_feedback.
	SyncSlots, HotStandbyFeedback bool
	// StandbySlots is its synchronized_standby_slots: a copy of the
	// primary's makes every logical decoding on it wait, once promoted,
	// for slots it does not have.
	StandbySlots string
}

// CheckStandby reads, on conn (a connection to a standby of the source,
// PostgreSQL 17 or later), its copy of the slot.
func CheckStandby(ctx context.Context, conn *pgx.Conn, slot string) (StandbySlot, error) {
	var (
		st                  StandbySlot
		synced              *bool
		confirmed, replayed string
		sync, feedback      string
	)
	err := conn.QueryRow(ctx, standbySlotSQL, slot).Scan(&synced, &confirmed, &st.Invalidated, &replayed, &st.InRecovery, &sync, &feedback, &st.StandbySlots)
	if err != nil {
		return st, fmt.Errorf("read the standby's copy of slot %s (a standby of PostgreSQL 17 or later): %w", slot, err)
	}
	st.Exists, st.Synced = synced != nil, synced != nil && *synced
	st.SyncSlots, st.HotStandbyFeedback = sync == "on", feedback == "on"
	if st.Confirmed, err = parseSlotLSN(confirmed); err != nil {
		return st, err
	}
	if st.Replayed, err = parseSlotLSN(replayed); err != nil {
		return st, err
	}
	return st, nil
}
