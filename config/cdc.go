package config

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// CDCSource is a set of tables of another PostgreSQL database mirrored
// through logical replication (pgoutput): inserts, updates and deletes are
// applied to mirror tables and recorded as raw change rows.
type CDCSource struct {
	DSN string `yaml:"dsn"` // source database; the role needs REPLICATION
	// DSNFile names a file holding the DSN, instead of dsn.
	DSNFile string `yaml:"dsn_file"`
	// Publication and Slot are created when missing.
	Publication string `yaml:"publication"`
	Slot        string `yaml:"slot"`
	// Tables are "schema.table" or "table" (schema public).
	Tables []string `yaml:"tables"`
	// Snapshot is initial (copy the tables before streaming, when the
	// slot is created) or never.
	Snapshot string `yaml:"snapshot"`
	// SnapshotWorkers is how many key-range chunks are copied at once;
	// SnapshotChunkRows is the rows of a chunk, as estimated from the
	// table's statistics.
	SnapshotWorkers   int `yaml:"snapshot_workers"`
	SnapshotChunkRows int `yaml:"snapshot_chunk_rows"`
	// ResyncChunkRows is the rows of a chunk of a resync (tidemark
	// resync, a table added), each applied in one warehouse transaction
	// of the stream.
	ResyncChunkRows int `yaml:"resync_chunk_rows"`
	// Truncate is apply (empty the mirror) or ignore.
	Truncate string `yaml:"truncate"`
	// HeartbeatEvery writes a logical message on the source at this
	// interval so that the slot advances while the tables are quiet; 0
	// disables it.
	HeartbeatEvery Duration `yaml:"heartbeat_every"`
	// StatusEvery is the interval of standby status updates.
	StatusEvery Duration `yaml:"status_every"`
	// MaxBufferBytes bounds the memory of a streamed in-progress
	// transaction before it spills to disk.
	MaxBufferBytes ByteSize `yaml:"max_buffer_bytes"`
	// FailoverSlot is whether the slot is a failover slot, synced to
	// standbys that sync_replication_slots (PostgreSQL 17 and later):
	// auto (when the source can), on (refuse a source that cannot) or
	// off.
	FailoverSlot string `yaml:"failover_slot"`
	// StandbyDSN names a standby of the source, which the slot's checks
	// read: whether it has the slot synced, and how far behind.
	StandbyDSN string `yaml:"standby_dsn"`
	// StandbyDSNFile names a file holding StandbyDSN.
	StandbyDSNFile string `yaml:"standby_dsn_file"`
	// PrimaryDSN names the primary of a source that is a standby
	// (decoding on a standby, PostgreSQL 16 and later): the publication
	// is created there, heartbeats are written there, and it is asked
	// for a running-transactions record while the slot is created.
	PrimaryDSN string `yaml:"primary_dsn"`
	// PrimaryDSNFile names a file holding PrimaryDSN.
	PrimaryDSNFile string `yaml:"primary_dsn_file"`
}

// CDC option values.
const (
	SnapshotInitial = "initial"
	SnapshotNever   = "never"
	TruncateApply   = "apply"
	TruncateIgnore  = "ignore"
	FailoverAuto    = "auto"
	FailoverOn      = "on"
	FailoverOff     = "off"
)

var slotRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (cfg *Config) validateCDCSource(ix *index, p string, s *Source) {
	c := s.CDC
	if c.DSN == "" {
		ix.add(p+".cdc.dsn", "is required: the source database's connection string")
	}
	if !slotRe.MatchString(c.Publication) {
		ix.add(p+".cdc.publication", "must match %s, got %q", slotRe, c.Publication)
	}
	if !slotRe.MatchString(c.Slot) {
		ix.add(p+".cdc.slot", "must match %s (a replication slot name), got %q", slotRe, c.Slot)
	}
	if len(c.Tables) == 0 {
		ix.add(p+".cdc.tables", "at least one table is required")
	}
	seen := map[string]bool{}
	for i, t := range c.Tables {
		tp := fmt.Sprintf("%s.cdc.tables[%d]", p, i)
		schema, name := SplitTable(t)
		switch {
		case !ValidTableName(t):
			ix.add(tp, "must be a table name such as customers or public.customers (lower-case identifiers), got %q", t)
		case seen[schema+"."+name]:
			ix.add(tp, "table %s.%s is listed twice", schema, name)
		}
		seen[schema+"."+name] = true
	}
	for _, key := range []string{"snapshot", "truncate", "snapshot_workers", "snapshot_chunk_rows", "resync_chunk_rows", "heartbeat_every", "status_every", "max_buffer_bytes", "failover_slot"} {
		cfg.check(ix, "sources.<name>.cdc."+key, s.Name)
	}
	for key, dsn := range map[string]string{"standby_dsn": c.StandbyDSN, "primary_dsn": c.PrimaryDSN} {
		if dsn == "" {
			continue
		}
		if _, err := pgx.ParseConfig(dsn); err != nil {
			ix.add(p+".cdc."+key, "is not a valid PostgreSQL connection string: %s", redactErr(err))
		}
	}
	if s.EventID != "" || s.EventTime != "" {
		ix.add(p, "event_id and event_time pointers apply to Kafka sources; a CDC source's event time is the source commit time")
	}
	m := s.Mirror
	switch {
	case m == nil:
		ix.add(p+".mirror", "is required for a CDC source: mirror: {schema: NAME} or, for one table, mirror: {table: NAME}")
	case m.Table != "" && m.Schema != "":
		ix.add(p+".mirror", "set mirror.table (one table) or mirror.schema (mirrors named like the source tables), not both")
	case m.Table != "" && len(c.Tables) > 1:
		ix.add(p+".mirror.table", "names one mirror but cdc.tables lists %d tables; use mirror.schema", len(c.Tables))
	case m.Schema != "" && !identRe.MatchString(m.Schema):
		ix.add(p+".mirror.schema", "%q is not a schema name", m.Schema)
	case ReservedSchema(m.Schema):
		ix.add(p+".mirror.schema", "schema %s belongs to tidemark; choose another", m.Schema)
	}
}

// MirrorTables returns the mirror table of each source table of a CDC
// source, in the order of cdc.tables: mirror.table for a single table,
// otherwise mirror.schema and the source table's name.
func (s *Source) MirrorTables() map[string]string {
	out := map[string]string{}
	if s.CDC == nil || s.Mirror == nil {
		return out
	}
	for _, t := range s.CDC.Tables {
		schema, name := SplitTable(t)
		if s.Mirror.Table != "" {
			out[schema+"."+name] = s.Mirror.Table
			continue
		}
		out[schema+"."+name] = s.Mirror.Schema + "." + name
	}
	return out
}
