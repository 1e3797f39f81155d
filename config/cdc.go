package config

import (
	"fmt"
	"regexp"
	"time"
)

// CDCSource is a set of tables of another PostgreSQL database mirrored
// through logical replication (pgoutput): inserts, updates and deletes are
// applied to mirror tables and recorded as raw change rows.
type CDCSource struct {
	DSN string `yaml:"dsn"` // source database; the role needs REPLICATION
	// DSNFile names a file holding the DSN, instead of dsn.
	DSNFile string `yaml:"dsn_file"`
	// Publication and Slot default to tidemark_<source>; both are created
	// when missing.
	Publication string `yaml:"publication"`
	Slot        string `yaml:"slot"`
	// Tables are "schema.table" or "table" (schema public).
	Tables []string `yaml:"tables"`
	// Snapshot is initial (default: copy the tables before streaming,
	// when the slot is created) or never.
	Snapshot string `yaml:"snapshot"`
	// SnapshotWorkers is how many key-range chunks are copied at once
	// (default 2); SnapshotChunkRows is the rows of a chunk, as
	// estimated from the table's statistics (default 250000).
	SnapshotWorkers   int `yaml:"snapshot_workers"`
	SnapshotChunkRows int `yaml:"snapshot_chunk_rows"`
	// Truncate is apply (default: empty the mirror) or ignore.
	Truncate string `yaml:"truncate"`
	// HeartbeatEvery writes a logical message on the source at this
	// interval so that the slot advances while the tables are quiet;
	// default 1m, 0 disables.
	HeartbeatEvery *Duration `yaml:"heartbeat_every"`
	// StatusEvery is the interval of standby status updates; default 10s.
	StatusEvery Duration `yaml:"status_every"`
	// MaxBufferBytes bounds the memory of a streamed in-progress
	// transaction before it spills to disk; default 64MiB.
	MaxBufferBytes ByteSize `yaml:"max_buffer_bytes"`
}

// CDC option values.
const (
	SnapshotInitial = "initial"
	SnapshotNever   = "never"
	TruncateApply   = "apply"
	TruncateIgnore  = "ignore"
)

var slotRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c *Config) applyCDCDefaults(s *Source) {
	p := s.CDC
	if p == nil {
		return
	}
	if p.Publication == "" {
		p.Publication = "tidemark_" + s.Name
	}
	if p.Slot == "" {
		p.Slot = "tidemark_" + s.Name
	}
	if p.Snapshot == "" {
		p.Snapshot = SnapshotInitial
	}
	if p.SnapshotWorkers == 0 {
		p.SnapshotWorkers = 2
	}
	if p.SnapshotChunkRows == 0 {
		p.SnapshotChunkRows = 250000
	}
	if p.Truncate == "" {
		p.Truncate = TruncateApply
	}
	if p.HeartbeatEvery == nil {
		d := Duration(time.Minute)
		p.HeartbeatEvery = &d
	}
	if p.StatusEvery == 0 {
		p.StatusEvery = Duration(10 * time.Second)
	}
	if p.MaxBufferBytes == 0 {
		p.MaxBufferBytes = 64 << 20
	}
	if s.RawPartition == "" {
		s.RawPartition = PartitionMonth
	}
	if m := s.Mirror; m != nil && m.Schema == "" && m.Table == "" {
		m.Schema = "public"
	}
}

func validateCDCSource(ix *index, p string, s *Source) {
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
	oneOf(ix, p+".cdc.snapshot", c.Snapshot, SnapshotInitial, SnapshotNever)
	oneOf(ix, p+".cdc.truncate", c.Truncate, TruncateApply, TruncateIgnore)
	if c.SnapshotWorkers < 1 || c.SnapshotWorkers > 32 {
		ix.add(p+".cdc.snapshot_workers", "must be between 1 and 32, got %d", c.SnapshotWorkers)
	}
	if c.SnapshotChunkRows < 1000 {
		ix.add(p+".cdc.snapshot_chunk_rows", "must be at least 1000, got %d", c.SnapshotChunkRows)
	}
	if *c.HeartbeatEvery != 0 && c.HeartbeatEvery.D() < time.Second {
		ix.add(p+".cdc.heartbeat_every", "must be 0 (off) or at least 1s")
	}
	if c.StatusEvery.D() < 100*time.Millisecond || c.StatusEvery.D() > time.Minute {
		ix.add(p+".cdc.status_every", "must be between 100ms and 1m")
	}
	if c.MaxBufferBytes < 1<<20 {
		ix.add(p+".cdc.max_buffer_bytes", "must be at least 1MiB")
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
	case m.Schema == "raw" || m.Schema == "tidemark":
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
