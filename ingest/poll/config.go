package poll

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/mirror"
)

// Config is what a Poller reads of its source's configuration. ConfigFrom
// builds it from the configuration file; New checks it.
type Config struct {
	// Source is the poll source's name: the raw table raw.<Source>, the
	// key of its watermark and the label of its metrics.
	Source string
	// DSN is the connection string of the source database (poll.dsn).
	DSN string
	// Table is the source table (poll.table).
	Table pgx.Identifier
	// Key lists the columns of a unique key of Table (poll.key).
	Key []string
	// UpdatedAt is the column of Table that every write sets
	// (poll.updated_at).
	UpdatedAt string
	// TimeZone is the IANA zone in which a timestamp-without-time-zone
	// UpdatedAt is written, "" for none (poll.time_zone).
	TimeZone string
	// SoftDelete is Table's soft-delete column, a boolean or a
	// timestamp, "" for none (poll.soft_delete).
	SoftDelete string
	// Lookback is how far before the watermark each run reads again
	// (poll.lookback).
	Lookback time.Duration
	// SafetyLag keeps a run's upper bound this far behind the source's
	// clock (poll.safety_lag).
	SafetyLag time.Duration
	// Every is the interval between the runs of Run (poll.every).
	Every time.Duration
	// ChunkRows is how many rows are fetched from the source at a time
	// (poll.chunk_rows).
	ChunkRows int
	// MaxRowsPerRun bounds the rows newer than the watermark that one
	// run loads (poll.max_rows_per_run).
	MaxRowsPerRun int
	// OutOfOrderness is how much older than the watermark a row may
	// still arrive, besides Lookback, for the event-time watermark
	// (watermark.out_of_orderness).
	OutOfOrderness time.Duration
	// Mirror is the warehouse table the rows are merged into
	// (mirror.table).
	Mirror pgx.Identifier
	// DeletedColumn and LoadedColumn are the mirror's own columns: when a
	// row was found deleted, and when it was last written
	// (mirror.deleted_column, mirror.loaded_column).
	DeletedColumn, LoadedColumn string
	// HardDeletes removes from the mirror the rows found deleted at the
	// source rather than flagging them (mirror.deletes: hard).
	HardDeletes bool
	// RawPartition is how raw.<Source> is partitioned: config.PartitionDay
	// or config.PartitionMonth (raw_partition).
	RawPartition string
	// WriteTimeout bounds each wait of a run, on the source or in the
	// warehouse, without progress (warehouse.write_timeout).
	WriteTimeout time.Duration
}

// ConfigFrom returns the Config of the poll source called name in cfg, a
// loaded (so validated) configuration.
func ConfigFrom(cfg *config.Config, name string) (Config, error) {
	src := cfg.Sources[name]
	if src.Kind() != config.KindPoll {
		return Config{}, fmt.Errorf("%w: no poll source is named %q", ErrSource, name)
	}
	t, err := mirror.FromConfig(src)
	if err != nil {
		return Config{}, err
	}
	p := src.Poll
	return Config{
		Source:         name,
		DSN:            p.DSN,
		Table:          t.Source,
		Key:            t.Key,
		UpdatedAt:      p.UpdatedAt,
		TimeZone:       p.TimeZone,
		SoftDelete:     p.SoftDelete,
		Lookback:       p.Lookback.Duration(),
		SafetyLag:      p.SafetyLag.Duration(),
		Every:          p.Every.Duration(),
		ChunkRows:      int(p.ChunkRows),
		MaxRowsPerRun:  int(p.MaxRowsPerRun),
		OutOfOrderness: src.Watermark.OutOfOrderness.Duration(),
		Mirror:         t.Target,
		DeletedColumn:  t.DeletedColumn,
		LoadedColumn:   t.LoadedColumn,
		HardDeletes:    t.Hard,
		RawPartition:   src.RawPartition,
		WriteTimeout:   cfg.Warehouse.WriteTimeout.Duration(),
	}, nil
}

// validate reports the first setting of c that a Poller cannot work with.
func (c *Config) validate() error {
	problem := func(field, format string, args ...any) error {
		return fmt.Errorf("%w %s: %s %s", ErrSource, c.Source, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Source == "":
		return fmt.Errorf("%w: Source is required", ErrSource)
	case c.DSN == "":
		return problem("DSN", "is required")
	case !identified(c.Table):
		return problem("Table", "must name a table, got %q", []string(c.Table))
	case len(c.Key) == 0:
		return problem("Key", "needs at least one column")
	case c.UpdatedAt == "":
		return problem("UpdatedAt", "is required")
	case c.Lookback < 0:
		return problem("Lookback", "must not be negative, got %s", c.Lookback)
	case c.SafetyLag < 0:
		return problem("SafetyLag", "must not be negative, got %s", c.SafetyLag)
	case c.Every <= 0:
		return problem("Every", "must be positive, got %s", c.Every)
	case c.ChunkRows < 1:
		return problem("ChunkRows", "must be at least 1, got %d", c.ChunkRows)
	case c.MaxRowsPerRun < 1:
		return problem("MaxRowsPerRun", "must be at least 1, got %d", c.MaxRowsPerRun)
	case c.OutOfOrderness < 0:
		return problem("OutOfOrderness", "must not be negative, got %s", c.OutOfOrderness)
	case !identified(c.Mirror):
		return problem("Mirror", "must name a table, got %q", []string(c.Mirror))
	case c.DeletedColumn == "" || c.LoadedColumn == "" || c.DeletedColumn == c.LoadedColumn:
		return problem("DeletedColumn and LoadedColumn", "must be two column names, got %q and %q", c.DeletedColumn, c.LoadedColumn)
	case c.RawPartition != config.PartitionDay && c.RawPartition != config.PartitionMonth:
		return problem("RawPartition", "must be %s or %s, got %q", config.PartitionDay, config.PartitionMonth, c.RawPartition)
	case c.WriteTimeout <= 0:
		return problem("WriteTimeout", "must be positive, got %s", c.WriteTimeout)
	}
	return nil
}

// identified reports whether id names a table: one or two parts, none
// empty.
func identified(id pgx.Identifier) bool {
	if len(id) == 0 || len(id) > 2 {
		return false
	}
	for _, part := range id {
		if part == "" {
			return false
		}
	}
	return true
}
