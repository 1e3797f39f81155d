package cdc

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
)

// Config is what a Reader, Inspect and Mirrors read of a CDC source's
// configuration. ConfigFrom builds it from the configuration file; New
// checks it.
type Config struct {
	// Source is the CDC source's name: the raw table raw.<Source>, the
	// key of its stored position and the label of its metrics.
	Source string
	// DSN is the connection string of the source database (cdc.dsn).
	DSN string
	// PrimaryDSN is the primary of a source that is a standby, where the
	// publication is created and heartbeats are written; "" for none
	// (cdc.primary_dsn).
	PrimaryDSN string
	// StandbyDSN is a standby of the source whose copy of the slot
	// Inspect reads; "" for none (cdc.standby_dsn).
	StandbyDSN string
	// Publication and Slot are the source's publication and logical
	// replication slot, created when missing (cdc.publication,
	// cdc.slot).
	Publication, Slot string
	// Tables are the source tables read, each with its mirror
	// (cdc.tables, mirror.table or mirror.schema).
	Tables []Table
	// Snapshot is config.SnapshotInitial (copy the tables when the slot
	// is created) or config.SnapshotNever (cdc.snapshot).
	Snapshot string
	// SnapshotWorkers is how many chunks of the snapshot are copied at
	// once (cdc.snapshot_workers).
	SnapshotWorkers int
	// SnapshotChunkRows is the estimated rows of a snapshot chunk
	// (cdc.snapshot_chunk_rows).
	SnapshotChunkRows int
	// ResyncChunkRows is the rows of a resync's chunk, which the stream
	// applies in one transaction (cdc.resync_chunk_rows).
	ResyncChunkRows int
	// ApplyTruncate empties the mirrors of the tables truncated at the
	// source; false ignores a truncation (cdc.truncate).
	ApplyTruncate bool
	// HeartbeatEvery is how often a logical message is written on the
	// source so that the slot moves while the tables are quiet; 0 writes
	// none (cdc.heartbeat_every).
	HeartbeatEvery time.Duration
	// StatusEvery is the interval of standby status updates, of storing
	// the confirmed position and of the slot's metrics
	// (cdc.status_every).
	StatusEvery time.Duration
	// MaxBufferBytes bounds the memory of a streamed transaction in
	// progress before it spills to disk (cdc.max_buffer_bytes).
	MaxBufferBytes int
	// FailoverSlot is config.FailoverAuto, config.FailoverOn or
	// config.FailoverOff: whether the slot is made a failover slot
	// (cdc.failover_slot).
	FailoverSlot string
	// DeletedColumn and LoadedColumn are the mirrors' own columns: when a
	// row was deleted at the source, and when it was last written
	// (mirror.deleted_column, mirror.loaded_column).
	DeletedColumn, LoadedColumn string
	// HardDeletes removes the rows deleted at the source from the
	// mirrors rather than flagging them (mirror.deletes: hard).
	HardDeletes bool
	// RawPartition is how raw.<Source> is partitioned: config.PartitionDay
	// or config.PartitionMonth (raw_partition).
	RawPartition string
	// Distribute creates the raw table and missing mirrors distributed on
	// a Citus warehouse (warehouse.distribute).
	Distribute bool
	// WriteTimeout bounds each wait on the warehouse or on a source query
	// (warehouse.write_timeout).
	WriteTimeout time.Duration
	// IdleInTransactionTimeout is the warehouse's
	// idle_in_transaction_session_timeout, 0 for none: a transaction
	// waiting for its group runs a statement well within it
	// (warehouse.idle_in_transaction_session_timeout).
	IdleInTransactionTimeout time.Duration
}

// Table is a source table of a CDC source and its mirror.
type Table struct {
	// Source is the table at the source, Mirror its mirror in the
	// warehouse; both schema-qualified.
	Source, Mirror pgx.Identifier
}

// ConfigFrom returns the Config of the CDC source called name in cfg, a
// loaded (so validated) configuration.
func ConfigFrom(cfg *config.Config, name string) (Config, error) {
	src := cfg.Sources[name]
	if src.Kind() != config.KindCDC {
		return Config{}, fmt.Errorf("cdc: no CDC source is named %q", name)
	}
	c, m := src.CDC, src.Mirror
	mirrors := src.MirrorTables()
	tables := make([]Table, len(c.Tables))
	for i, t := range c.Tables {
		schema, table := config.SplitTable(t)
		ms, mt := config.SplitTable(mirrors[schema+"."+table])
		tables[i] = Table{Source: pgx.Identifier{schema, table}, Mirror: pgx.Identifier{ms, mt}}
	}
	return Config{
		Source:                   name,
		DSN:                      c.DSN,
		PrimaryDSN:               c.PrimaryDSN,
		StandbyDSN:               c.StandbyDSN,
		Publication:              c.Publication,
		Slot:                     c.Slot,
		Tables:                   tables,
		Snapshot:                 c.Snapshot,
		SnapshotWorkers:          c.SnapshotWorkers,
		SnapshotChunkRows:        c.SnapshotChunkRows,
		ResyncChunkRows:          c.ResyncChunkRows,
		ApplyTruncate:            c.Truncate == config.TruncateApply,
		HeartbeatEvery:           c.HeartbeatEvery.Duration(),
		StatusEvery:              c.StatusEvery.Duration(),
		MaxBufferBytes:           int(c.MaxBufferBytes),
		FailoverSlot:             c.FailoverSlot,
		DeletedColumn:            m.DeletedColumn,
		LoadedColumn:             m.LoadedColumn,
		HardDeletes:              m.Deletes == config.DeletesHard,
		RawPartition:             src.RawPartition,
		Distribute:               cfg.Distributes(name),
		WriteTimeout:             cfg.Warehouse.WriteTimeout.Duration(),
		IdleInTransactionTimeout: cfg.Warehouse.IdleInTransactionSessionTimeout.Duration(),
	}, nil
}

// validate reports the first setting of c that a Reader cannot work with.
func (c *Config) validate() error {
	problem := func(field, format string, args ...any) error {
		return fmt.Errorf("cdc: source %s: %s %s", c.Source, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Source == "":
		return errors.New("cdc: Source is required")
	case c.DSN == "":
		return problem("DSN", "is required")
	case c.Publication == "":
		return problem("Publication", "is required")
	case c.Slot == "":
		return problem("Slot", "is required")
	case len(c.Tables) == 0:
		return problem("Tables", "needs at least one table")
	case c.Snapshot != config.SnapshotInitial && c.Snapshot != config.SnapshotNever:
		return problem("Snapshot", "must be %s or %s, got %q", config.SnapshotInitial, config.SnapshotNever, c.Snapshot)
	case c.SnapshotWorkers < 1:
		return problem("SnapshotWorkers", "must be at least 1, got %d", c.SnapshotWorkers)
	case c.SnapshotChunkRows < 1:
		return problem("SnapshotChunkRows", "must be at least 1, got %d", c.SnapshotChunkRows)
	case c.ResyncChunkRows < 1:
		return problem("ResyncChunkRows", "must be at least 1, got %d", c.ResyncChunkRows)
	case c.HeartbeatEvery < 0:
		return problem("HeartbeatEvery", "must not be negative, got %s", c.HeartbeatEvery)
	case c.StatusEvery <= 0:
		return problem("StatusEvery", "must be positive, got %s", c.StatusEvery)
	case c.MaxBufferBytes < 1:
		return problem("MaxBufferBytes", "must be at least 1, got %d", c.MaxBufferBytes)
	case c.FailoverSlot != config.FailoverAuto && c.FailoverSlot != config.FailoverOn && c.FailoverSlot != config.FailoverOff:
		return problem("FailoverSlot", "must be %s, %s or %s, got %q", config.FailoverAuto, config.FailoverOn, config.FailoverOff, c.FailoverSlot)
	case c.DeletedColumn == "" || c.LoadedColumn == "" || c.DeletedColumn == c.LoadedColumn:
		return problem("DeletedColumn and LoadedColumn", "must be two column names, got %q and %q", c.DeletedColumn, c.LoadedColumn)
	case c.RawPartition != config.PartitionDay && c.RawPartition != config.PartitionMonth:
		return problem("RawPartition", "must be %s or %s, got %q", config.PartitionDay, config.PartitionMonth, c.RawPartition)
	case c.WriteTimeout <= 0:
		return problem("WriteTimeout", "must be positive, got %s", c.WriteTimeout)
	case c.IdleInTransactionTimeout < 0:
		return problem("IdleInTransactionTimeout", "must not be negative, got %s", c.IdleInTransactionTimeout)
	}
	seen := map[string]bool{}
	for i, t := range c.Tables {
		field := fmt.Sprintf("Tables[%d]", i)
		if !qualified(t.Source) || !qualified(t.Mirror) {
			return problem(field, "must name a source table and its mirror, each as schema and name, got %q and %q",
				[]string(t.Source), []string(t.Mirror))
		}
		name := t.Source[0] + "." + t.Source[1]
		if seen[name] {
			return problem(field, "lists %s a second time", name)
		}
		seen[name] = true
	}
	return nil
}

// qualified reports whether id is a schema-qualified name: two parts,
// neither empty.
func qualified(id pgx.Identifier) bool { return len(id) == 2 && id[0] != "" && id[1] != "" }
