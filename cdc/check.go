package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// ErrSetup means the source database or its slot cannot be used as configured; the message says what to fix.
var ErrSetup = errors.New("cdc setup")

// CheckSpec is what Check verifies.
type CheckSpec struct {
	// Source is the tidemark source name, used in messages as
	// sources.<Source>.cdc.<key>.
	Source string
	// Slot is the replication slot name.
	Slot string
	// Publication is the publication name.
	Publication string
	// Tables are the source tables, each {schema, table}; a one-part
	// name is in schema public.
	Tables []pgx.Identifier
	// Position is the LSN tidemark stored for this source; 0 means
	// tidemark has never read from the slot.
	Position pglogrepl.LSN
	// Failover is cdc.failover_slot: auto, on or off ("" is auto).
	Failover string
	// Replace reports a slot that tidemark drops and creates again (a
	// snapshot cut short, or a slot replaced by tidemark resync
	// --new-slot): the WAL it lost is not held against it.
	Replace bool
	// Primary reports cdc.primary_dsn set: on a standby, the reader
	// changes the publication there.
	Primary bool
}

// SlotState describes the slot if it exists.
type SlotState struct {
	// Exists reports whether the slot exists; the other fields are zero
	// when it does not.
	Exists bool
	// Plugin is the output plugin ("" for a physical slot), Database the
	// database the slot belongs to, and WALStatus one of reserved,
	// extended, unreserved or lost ("" if null).
	Plugin, Database, WALStatus string
	// ConfirmedFlush is the position the slot's consumer has confirmed;
	// RestartLSN the oldest WAL the slot still needs (0 if null, as for a
	// lost slot).
	ConfirmedFlush, RestartLSN pglogrepl.LSN
	// Active reports whether a connection is streaming from the slot.
	Active bool
	// Failover reports a failover slot, which standbys that sync slots
	// copy; Synced a slot that is such a copy, on a standby (both
	// PostgreSQL 17 and later).
	Failover, Synced bool
}

// Report is what Check found.
type Report struct {
	// Slot is the state of spec.Slot.
	Slot SlotState
	// PublicationExists reports whether spec.Publication exists.
	PublicationExists bool
	// Unpublished are the tables of spec that the existing publication
	// (not FOR ALL TABLES) does not publish. MayPublish reports that the
	// role may add them (it owns the publication and the tables): the
	// reader adds them and copies them while the stream goes on; else
	// they are a problem.
	Unpublished []pgx.Identifier
	MayPublish  bool
	// Warnings describe things that work but that the operator should
	// know, such as replica identity DEFAULT: deletes carry only the key.
	Warnings []string
	// SystemID is the source cluster's system identifier, as
	// IDENTIFY_SYSTEM reports it.
	SystemID string
	// ServerVersion is the source's server_version_num (170002 for
	// 17.2); InRecovery reports a standby.
	ServerVersion int
	InRecovery    bool
	// StandbySlots is synchronized_standby_slots, the physical slots of
	// the standbys that logical consumers wait for (17 and later; "" when
	// unset or older).
	StandbySlots string
}

// SQL run by Check, all read-only.
const (
	checkWALLevelSQL = `SELECT current_setting('wal_level')`

	checkSystemIDSQL = `SELECT system_identifier FROM pg_control_system()`

	// checkServerSQL reads the server's version, whether it is a
	// standby, and its hot_standby_feedback.
	checkServerSQL = `SELECT current_setting('server_version_num')::int, pg_is_in_recovery(), current_setting('hot_standby_feedback')`

	// checkSlotFailoverSQL reads the columns of a slot that PostgreSQL 17
	// added, and the standbys logical consumers wait for.
	checkSlotFailoverSQL = `
SELECT failover, synced, current_setting('synchronized_standby_slots')
FROM pg_replication_slots
WHERE slot_name = $1`

	checkRoleSQL = `
SELECT current_user::text, r.rolreplication, r.rolsuper
FROM pg_roles r
WHERE r.rolname = current_user`

	// checkTableSQL describes one table: its kind, replica identity, whether it
	// has a primary key and an index marked as replica identity, and
	// whether the current role may read it.
	checkTableSQL = `
SELECT c.relkind::text,
       c.relreplident::text,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
       has_table_privilege(c.oid, 'SELECT')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

	checkSlotSQL = `
SELECT coalesce(plugin, ''),
       slot_type,
       coalesce(database::text, ''),
       current_database()::text,
       coalesce(wal_status, ''),
       coalesce(confirmed_flush_lsn::text, ''),
       coalesce(restart_lsn::text, ''),
       active
FROM pg_replication_slots
WHERE slot_name = $1`

	checkPublicationSQL = `SELECT puballtables FROM pg_publication WHERE pubname = $1`

	// checkMayPublishSQL reads whether the role may add the tables
	// (quoted names) to the publication: ALTER PUBLICATION ... ADD TABLE
	// needs ownership of both.
	checkMayPublishSQL = `
SELECT pg_has_role(p.pubowner, 'USAGE')
       AND coalesce(bool_and(pg_has_role(c.relowner, 'USAGE')), true)
FROM pg_publication p
LEFT JOIN pg_class c ON c.oid = ANY (SELECT to_regclass(t) FROM unnest($2::text[]) AS t)
WHERE p.pubname = $1
GROUP BY p.pubowner`

	checkPublicationTablesSQL = `
SELECT schemaname::text, tablename::text
FROM pg_publication_tables
WHERE pubname = $1`
)

// Relation kinds and replica identities of pg_class.
const (
	relkindTable       = "r"
	relkindPartitioned = "p"

	identityDefault = "d"
	identityNothing = "n"
	identityFull    = "f"
	identityIndex   = "i"
)

// Slot WAL states of pg_replication_slots.wal_status that Check acts on.
const (
	walStatusUnreserved = "unreserved"
	walStatusLost       = "lost"
)

// Check runs the checks on conn (a regular, non-replication connection to the source database).
//
// It runs every check and reports all the problems it finds in one error
// wrapping ErrSetup, one problem per line, each naming what to fix. Errors
// of the connection or of the queries themselves do not wrap ErrSetup. The
// Report holds what was found so far even when the error is not nil.
//
// A slot that does not exist while spec.Position is 0, and a publication
// that does not exist, are not problems: the caller creates them. Whether
// the slot's confirmed position is ahead of spec.Position is left to the
// caller, which finds both in the Report and the spec.
func Check(ctx context.Context, conn *pgx.Conn, spec CheckSpec) (Report, error) {
	c := checker{conn: conn, spec: spec}
	steps := []func(context.Context) error{
		c.checkWALLevel,
		c.readSystemID,
		c.readServer,
		c.checkRole,
		c.checkTables,
		c.checkSlot,
		c.checkPublication,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return c.report, err
		}
	}
	return c.report, c.setupError()
}

// checker carries the state of one Check.
type checker struct {
	conn     *pgx.Conn
	spec     CheckSpec
	report   Report
	problems []string
	role     string         // current_user
	tables   []checkedTable // the spec tables that exist, in spec order
}

// checkedTable is what checkTables learned of one existing table.
type checkedTable struct {
	schema, name string
	kind         string
}

func (c *checker) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *checker) warn(format string, args ...any) {
	c.report.Warnings = append(c.report.Warnings, fmt.Sprintf(format, args...))
}

// key names a configuration key of the source.
func (c *checker) key(name string) string {
	return "sources." + c.spec.Source + ".cdc." + name
}

func (c *checker) setupError() error {
	switch len(c.problems) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: source %s: %s", ErrSetup, c.spec.Source, c.problems[0])
	default:
		return fmt.Errorf("%w: source %s: %d problems:\n- %s", ErrSetup, c.spec.Source, len(c.problems),
			strings.Join(c.problems, "\n- "))
	}
}

func (c *checker) checkWALLevel(ctx context.Context) error {
	var level string
	if err := c.conn.QueryRow(ctx, checkWALLevelSQL).Scan(&level); err != nil {
		return fmt.Errorf("cdc check: read wal_level: %w", err)
	}
	if level != "logical" {
		c.problem("the source server runs with wal_level = %s, and logical replication needs logical: "+
			"set wal_level = logical in postgresql.conf and restart the source", level)
	}
	return nil
}

func (c *checker) readSystemID(ctx context.Context) error {
	// The column is a bigint holding an unsigned 64-bit number; print it
	// unsigned, as IDENTIFY_SYSTEM does.
	var id int64
	if err := c.conn.QueryRow(ctx, checkSystemIDSQL).Scan(&id); err != nil {
		return fmt.Errorf("cdc check: read system identifier: %w", err)
	}
	c.report.SystemID = strconv.FormatUint(uint64(id), 10)
	return nil
}

func (c *checker) checkRole(ctx context.Context) error {
	var (
		role                   string
		replication, superuser bool
	)
	if err := c.conn.QueryRow(ctx, checkRoleSQL).Scan(&role, &replication, &superuser); err != nil {
		return fmt.Errorf("cdc check: read role attributes: %w", err)
	}
	c.role = role
	if !replication && !superuser {
		c.problem("%s: role %s may not replicate: as a superuser, run ALTER ROLE %s REPLICATION",
			c.key("dsn"), role, pgquote.Ident(role))
	}
	return nil
}

func (c *checker) checkTables(ctx context.Context) error {
	key := c.key("tables")
	for _, id := range c.spec.Tables {
		schema, name, ok := splitCheckedTable(id)
		if !ok {
			c.problem("%s: %q is not a table name: use schema.table or table", key, strings.Join(id, "."))
			continue
		}
		display := schema + "." + name
		quoted := pgquote.Ident(schema, name)
		var (
			kind, identity          string
			hasPK, hasIdentityIndex bool
			canSelect               bool
		)
		err := c.conn.QueryRow(ctx, checkTableSQL, schema, name).Scan(&kind, &identity, &hasPK, &hasIdentityIndex, &canSelect)
		if errors.Is(err, pgx.ErrNoRows) {
			c.problem("%s: table %s does not exist in the source database: create it or remove it from %s",
				key, display, key)
			continue
		}
		if err != nil {
			return fmt.Errorf("cdc check: read table %s: %w", display, err)
		}
		if kind != relkindTable && kind != relkindPartitioned {
			c.problem("%s: %s is not a table (pg_class.relkind %s); only tables can be replicated: remove it from %s",
				key, display, kind, key)
			continue
		}
		c.tables = append(c.tables, checkedTable{schema: schema, name: name, kind: kind})
		if !canSelect {
			c.problem("%s: role %s may not read table %s, which the snapshot needs: GRANT SELECT ON %s TO %s",
				key, c.role, display, quoted, pgquote.Ident(c.role))
		}
		switch identity {
		case identityFull:
		case identityDefault:
			if !hasPK {
				c.problem("%s: table %s has no primary key and replica identity DEFAULT, so its updates and deletes cannot be replicated: "+
					"add a primary key, or run ALTER TABLE %s REPLICA IDENTITY FULL (or REPLICA IDENTITY USING INDEX on a unique index of NOT NULL columns)",
					key, display, quoted)
				continue
			}
			c.warnKeyOnly(display, "DEFAULT", quoted)
		case identityIndex:
			if !hasIdentityIndex {
				c.problem("%s: table %s has replica identity USING INDEX but that index no longer exists, so its updates and deletes cannot be replicated: "+
					"run ALTER TABLE %s REPLICA IDENTITY FULL, or REPLICA IDENTITY USING INDEX on an existing unique index",
					key, display, quoted)
				continue
			}
			c.warnKeyOnly(display, "USING INDEX", quoted)
		case identityNothing:
			c.problem("%s: table %s has replica identity NOTHING, so its updates and deletes cannot be replicated: "+
				"run ALTER TABLE %s REPLICA IDENTITY DEFAULT (with a primary key), FULL, or USING INDEX",
				key, display, quoted)
		default:
			c.problem("%s: table %s has an unknown replica identity %q", key, display, identity)
		}
	}
	return nil
}

func (c *checker) warnKeyOnly(display, identity, quoted string) {
	c.warn("table %s has replica identity %s: deletes and key-changing updates carry only the key columns (the old row is not sent); "+
		"ALTER TABLE %s REPLICA IDENTITY FULL sends whole old rows", display, identity, quoted)
}

// splitCheckedTable returns the schema and name of a table identifier.
func splitCheckedTable(id pgx.Identifier) (schema, name string, ok bool) {
	switch {
	case len(id) == 1 && id[0] != "":
		return "public", id[0], true
	case len(id) == 2 && id[0] != "" && id[1] != "":
		return id[0], id[1], true
	default:
		return "", "", false
	}
}

func (c *checker) checkSlot(ctx context.Context) error {
	var (
		st                         SlotState
		slotType, currentDB        string
		confirmedText, restartText string
	)
	err := c.conn.QueryRow(ctx, checkSlotSQL, c.spec.Slot).Scan(&st.Plugin, &slotType, &st.Database, &currentDB,
		&st.WALStatus, &confirmedText, &restartText, &st.Active)
	key := c.key("slot")
	if errors.Is(err, pgx.ErrNoRows) {
		if c.spec.Position != 0 {
			c.problem("%s: replication slot %s does not exist, but tidemark has read changes from it up to %s: "+
				"it was dropped, or lost in a failover to a server that did not have it, and changes after that position may be missing. "+
				"Run tidemark resync %s --new-slot: a new slot, and every table copied again while the stream goes on",
				key, c.spec.Slot, c.spec.Position, c.spec.Source)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc check: read replication slot %s: %w", c.spec.Slot, err)
	}
	st.Exists = true
	if st.ConfirmedFlush, err = parseSlotLSN(confirmedText); err != nil {
		return fmt.Errorf("cdc check: slot %s confirmed_flush_lsn: %w", c.spec.Slot, err)
	}
	if st.RestartLSN, err = parseSlotLSN(restartText); err != nil {
		return fmt.Errorf("cdc check: slot %s restart_lsn: %w", c.spec.Slot, err)
	}
	if c.report.ServerVersion >= failoverSlotsVersion {
		if err := c.conn.QueryRow(ctx, checkSlotFailoverSQL, c.spec.Slot).Scan(&st.Failover, &st.Synced, &c.report.StandbySlots); err != nil {
			return fmt.Errorf("cdc check: read replication slot %s: %w", c.spec.Slot, err)
		}
	}
	c.report.Slot = st

	other := "drop it (SELECT pg_drop_replication_slot('" + c.spec.Slot + "')) if nothing else uses it, or set " + key + " to another name"
	switch {
	case slotType != "logical":
		c.problem("%s: replication slot %s is a %s slot, not a logical one: %s", key, c.spec.Slot, slotType, other)
		return nil
	case st.Plugin != "pgoutput":
		c.problem("%s: replication slot %s uses output plugin %s, not pgoutput: %s", key, c.spec.Slot, st.Plugin, other)
		return nil
	case st.Database != currentDB:
		c.problem("%s: replication slot %s belongs to database %s, not to %s, the database of %s: %s",
			key, c.spec.Slot, st.Database, currentDB, c.key("dsn"), other)
		return nil
	}
	if c.spec.Replace {
		return nil
	}
	switch st.WALStatus {
	case walStatusLost:
		since := "its confirmed position"
		if st.ConfirmedFlush != 0 {
			since = st.ConfirmedFlush.String()
		}
		c.problem("%s: replication slot %s has lost WAL it needed; the changes since %s are gone: "+
			"run tidemark resync %s --new-slot (a new slot, and every table copied again while the stream goes on); "+
			"raise max_slot_wal_keep_size on the source so that it does not happen again",
			key, c.spec.Slot, since, c.spec.Source)
	case walStatusUnreserved:
		c.warn("replication slot %s is about to lose WAL it needs (wal_status unreserved: it is behind by more than max_slot_wal_keep_size); "+
			"unless it catches up before the next checkpoint, the slot is lost and the tables must be resynced with a new slot", c.spec.Slot)
	}
	return nil
}

func parseSlotLSN(text string) (pglogrepl.LSN, error) {
	if text == "" {
		return 0, nil
	}
	return pglogrepl.ParseLSN(text)
}

// warnUnconfigured warns of the tables the publication publishes that the
// configuration does not name (a table removed from cdc.tables): their
// changes are sent and ignored, and their mirrors and raw rows are kept.
func (c *checker) warnUnconfigured(published map[[2]string]bool) {
	tracked := map[[2]string]bool{}
	for _, t := range c.tables {
		tracked[[2]string{t.schema, t.name}] = true
	}
	var extra []string
	for st := range published {
		if !tracked[st] {
			extra = append(extra, pgquote.Ident(st[0], st[1]))
		}
	}
	if len(extra) == 0 {
		return
	}
	slices.Sort(extra)
	c.warn("publication %s also publishes %s, which %s does not name: their changes are sent and ignored, their mirrors and raw rows are kept; "+
		"tidemark unpublish %s (ALTER PUBLICATION %s DROP TABLE %s) stops sending them",
		c.spec.Publication, strings.Join(extra, ", "), c.key("tables"), c.spec.Source, pgquote.Ident(c.spec.Publication), strings.Join(extra, ", "))
}

func (c *checker) checkPublication(ctx context.Context) error {
	var allTables bool
	err := c.conn.QueryRow(ctx, checkPublicationSQL, c.spec.Publication).Scan(&allTables)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc check: read publication %s: %w", c.spec.Publication, err)
	}
	c.report.PublicationExists = true
	// A publication FOR ALL TABLES lists every table, but a partitioned
	// table only when it publishes via the partition root; otherwise its
	// changes arrive under its partitions' names.
	rows, err := c.conn.Query(ctx, checkPublicationTablesSQL, c.spec.Publication)
	if err != nil {
		return fmt.Errorf("cdc check: read tables of publication %s: %w", c.spec.Publication, err)
	}
	published := map[[2]string]bool{}
	var schema, name string
	_, err = pgx.ForEachRow(rows, []any{&schema, &name}, func() error {
		published[[2]string{schema, name}] = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("cdc check: read tables of publication %s: %w", c.spec.Publication, err)
	}
	var missing, quoted []string
	partitioned := false
	if !allTables {
		c.warnUnconfigured(published)
	}
	for _, t := range c.tables {
		if published[[2]string{t.schema, t.name}] {
			continue
		}
		missing = append(missing, t.schema+"."+t.name)
		quoted = append(quoted, pgquote.Ident(t.schema, t.name))
		partitioned = partitioned || t.kind == relkindPartitioned
	}
	if len(missing) == 0 {
		return nil
	}
	pub := pgquote.Ident(c.spec.Publication)
	if allTables {
		fix := "ALTER PUBLICATION " + pub + " SET (publish_via_partition_root = true)"
		if !partitioned {
			fix = "a publication FOR ALL TABLES leaves out unlogged and temporary tables: publish regular tables"
		}
		c.problem("%s: publication %s (FOR ALL TABLES) does not publish %s under its own name: %s",
			c.key("publication"), c.spec.Publication, strings.Join(missing, ", "), fix)
		return nil
	}
	for _, t := range c.tables {
		if !published[[2]string{t.schema, t.name}] {
			c.report.Unpublished = append(c.report.Unpublished, pgx.Identifier{t.schema, t.name})
		}
	}
	if !partitioned {
		addable, err := c.mayAddToPublication(ctx, quoted)
		if err != nil {
			return err
		}
		if addable && c.report.InRecovery && !c.spec.Primary {
			c.problem("%s: publication %s does not publish %s, and the source is a standby, where it cannot be changed: run ALTER PUBLICATION %s ADD TABLE %s on the primary, or set %s",
				c.key("tables"), c.spec.Publication, strings.Join(missing, ", "), pub, strings.Join(quoted, ", "), c.key("primary_dsn"))
			return nil
		}
		if addable {
			c.report.MayPublish = true
			c.warn("publication %s does not publish %s: the reader adds them (ALTER PUBLICATION %s ADD TABLE %s) and copies them while the stream goes on",
				c.spec.Publication, strings.Join(missing, ", "), pub, strings.Join(quoted, ", "))
			return nil
		}
	}
	fix := "ALTER PUBLICATION " + pub + " ADD TABLE " + strings.Join(quoted, ", ")
	if partitioned {
		fix += " (for a partitioned table already in it: ALTER PUBLICATION " + pub + " SET (publish_via_partition_root = true))"
	}
	c.problem("%s: publication %s does not publish %s: run %s",
		c.key("publication"), c.spec.Publication, strings.Join(missing, ", "), fix)
	return nil
}

// mayAddToPublication reports whether the role may add the tables (quoted
// names) to the publication: it owns the publication and each table, or
// is a member of their owners.
func (c *checker) mayAddToPublication(ctx context.Context, quoted []string) (bool, error) {
	var may bool
	err := c.conn.QueryRow(ctx, checkMayPublishSQL, c.spec.Publication, quoted).Scan(&may)
	if err != nil {
		return false, fmt.Errorf("cdc check: read the owners of publication %s and its tables: %w", c.spec.Publication, err)
	}
	return may, nil
}
