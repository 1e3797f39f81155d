package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
)

// Config is what an Ingester, and Replay, read of the configuration.
// ConfigFrom builds it from the configuration file; New checks it.
//
// Four parts are blocks of the file as they are, for the code that takes
// them whole: Connection for the client's brokers, TLS and SASL,
// SchemaRegistry for the registry's client, and each Source's Decoding
// for its decoder and Mirror for a Debezium source's mirror.
type Config struct {
	// Connection is the connection to the brokers: only its Brokers,
	// ClientID, TLS and SASL are read (kafka.brokers, kafka.client_id,
	// kafka.tls, kafka.sasl).
	Connection config.Kafka
	// Group is the consumer group, also the key of the offsets stored in
	// the warehouse (kafka.group).
	Group string
	// StartOffset is where a partition without a stored offset starts:
	// "earliest" or "latest" (kafka.start_offset).
	StartOffset string
	// SessionTimeout and RebalanceTimeout are the consumer group's
	// (kafka.session_timeout, kafka.rebalance_timeout).
	SessionTimeout, RebalanceTimeout time.Duration
	// FetchMaxBytes and FetchMaxPartitionBytes bound a fetch, and one
	// partition's part of it (kafka.fetch_max_bytes,
	// kafka.fetch_max_partition_bytes).
	FetchMaxBytes, FetchMaxPartitionBytes int32
	// DecompressMaxBytes bounds what one record batch fetched may
	// decompress to: the larger of ingest.memory_max_bytes and
	// ingest.decode_max_bytes. A larger batch stops its partition.
	DecompressMaxBytes int
	// BatchMaxRows, BatchMaxBytes and BatchMaxAge bound a batch written
	// in one warehouse transaction (ingest.batch_max_rows,
	// ingest.batch_max_bytes, ingest.batch_max_age).
	BatchMaxRows  int
	BatchMaxBytes int64
	BatchMaxAge   time.Duration
	// Warehouse is the warehouse's connection and session settings
	// (warehouse.dsn and the session limits).
	Warehouse pgconnect.Settings
	// WriteTimeout bounds one attempt at a batch and each wait on the
	// warehouse (warehouse.write_timeout).
	WriteTimeout time.Duration
	// SchemaRegistry is the schema registry's configuration, for its
	// client (schema_registry); nil when no source reads it.
	SchemaRegistry *config.SchemaRegistry
	// RegistryTimeout bounds one request to the schema registry
	// (schema_registry.timeout); the schemas of one fetch are asked for
	// within it.
	RegistryTimeout time.Duration
	// Sources are the Kafka sources, Debezium ones included, in the
	// order their metrics are registered.
	Sources []Source
}

// Source is one Kafka source of a Config.
type Source struct {
	// Name is the source's name: the raw table raw.<Name> and the label
	// of its metrics.
	Name string
	// Topics are the topics it reads (kafka.topics).
	Topics []string
	// Decoding is the source's block of the configuration file, which
	// its decoder reads (decode.NewRegistryDecoder): the event pointers,
	// the format and the limits. The ingester reads nothing of it.
	Decoding *config.Source
	// Registry is whether its decoder reads the schema registry: a source
	// of a registry format, or a Debezium source when a registry is
	// configured.
	Registry bool
	// RawPartition is how raw.<Name> is partitioned: config.PartitionDay
	// or config.PartitionMonth (raw_partition).
	RawPartition string
	// Distribute creates raw.<Name>, and a Debezium source's missing
	// mirror, distributed on a Citus warehouse (warehouse.distribute).
	Distribute bool
	// DedupeWindow is how long a loaded event id drops later events with
	// the id (dedupe.by: event_id, dedupe.window); 0 when the source does
	// not dedupe by id.
	DedupeWindow time.Duration
	// Mirror is a Debezium source's mirror, which makes raw.<Name> a table
	// of row changes; nil for a source of events.
	Mirror *ChangeMirror
}

// ChangeMirror is the mirror of a Debezium source (its mirror block).
type ChangeMirror struct {
	// Target is the mirror table (mirror.table).
	Target pgx.Identifier
	// LoadedColumn, DeletedColumn and PositionColumn are the mirror's own
	// columns: when a row was last loaded, when it was deleted at the
	// source, and the source position of the change that wrote it.
	LoadedColumn, DeletedColumn, PositionColumn string
	// SourceTable is the source table the mirror follows (schema.table,
	// or a table in any schema); "" takes the table of the changes stored
	// (mirror.source_table).
	SourceTable string
}

// ConfigFrom returns the Config of the Kafka sources of cfg, a loaded (so
// validated) configuration.
func ConfigFrom(cfg *config.Config) Config {
	k := cfg.Kafka
	c := Config{
		Connection:             config.Kafka{Brokers: k.Brokers, ClientID: k.ClientID, TLS: k.TLS, SASL: k.SASL},
		Group:                  k.Group,
		StartOffset:            k.StartOffset,
		SessionTimeout:         k.SessionTimeout.Duration(),
		RebalanceTimeout:       k.RebalanceTimeout.Duration(),
		FetchMaxBytes:          int32(k.FetchMaxBytes),
		FetchMaxPartitionBytes: int32(k.FetchMaxPartitionBytes),
		DecompressMaxBytes:     int(max(cfg.Ingest.MemoryMaxBytes, cfg.Ingest.DecodeMaxBytes)),
		BatchMaxRows:           int(cfg.Ingest.BatchMaxRows),
		BatchMaxBytes:          int64(cfg.Ingest.BatchMaxBytes),
		BatchMaxAge:            cfg.Ingest.BatchMaxAge.Duration(),
		Warehouse:              cfg.Warehouse.Settings(),
		WriteTimeout:           cfg.Warehouse.WriteTimeout.Duration(),
		RegistryTimeout:        cfg.SchemaRegistry.Timeout.Duration(),
	}
	for _, name := range cfg.SourceNames() {
		sc := cfg.Sources[name]
		if !sc.Kind().Kafka() {
			continue
		}
		s := Source{Name: name, Topics: sc.Kafka.Topics, Decoding: sc, Registry: needsRegistry(cfg, sc),
			RawPartition: sc.RawPartition, Distribute: cfg.Distributes(name)}
		if sc.Kind() == config.KindDebezium {
			schema, table := config.SplitTable(sc.Mirror.Table)
			s.Mirror = &ChangeMirror{Target: pgx.Identifier{schema, table}, LoadedColumn: sc.Mirror.LoadedColumn,
				DeletedColumn: sc.Mirror.DeletedColumn, PositionColumn: sc.Mirror.PositionColumn, SourceTable: sc.Mirror.SourceTable}
		} else {
			s.DedupeWindow = sc.DedupeWindow()
		}
		if s.Registry {
			reg := cfg.SchemaRegistry
			c.SchemaRegistry = &reg
		}
		c.Sources = append(c.Sources, s)
	}
	return c
}

// needsRegistry reports whether the Kafka source sc of cfg reads the
// schema registry: a source of a registry format, or a Debezium source
// when a registry is configured.
func needsRegistry(cfg *config.Config, sc *config.Source) bool {
	return sc.Kind().Kafka() && config.UsesRegistry(sc.Format) || sc.Kind() == config.KindDebezium && cfg.SchemaRegistry.URL != ""
}

// usesRegistry reports whether a source of c reads the schema registry.
func (c *Config) usesRegistry() bool {
	for _, s := range c.Sources {
		if s.Registry {
			return true
		}
	}
	return false
}

// source returns the source of c called name, nil when there is none.
func (c *Config) source(name string) *Source {
	for i := range c.Sources {
		if c.Sources[i].Name == name {
			return &c.Sources[i]
		}
	}
	return nil
}

// validate reports the first setting of c that an Ingester cannot work
// with.
func (c *Config) validate() error {
	problem := func(field, format string, args ...any) error {
		return fmt.Errorf("ingest: %s %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case len(c.Sources) == 0:
		return errors.New("ingest: no Kafka sources configured")
	case len(c.Connection.Brokers) == 0:
		return problem("Connection.Brokers", "needs at least one broker")
	case c.StartOffset != "earliest" && c.StartOffset != "latest":
		return problem("StartOffset", "must be earliest or latest, got %q", c.StartOffset)
	case c.SessionTimeout <= 0:
		return problem("SessionTimeout", "must be positive, got %s", c.SessionTimeout)
	case c.RebalanceTimeout <= 0:
		return problem("RebalanceTimeout", "must be positive, got %s", c.RebalanceTimeout)
	case c.FetchMaxBytes < 1:
		return problem("FetchMaxBytes", "must be at least 1, got %d", c.FetchMaxBytes)
	case c.DecompressMaxBytes < 1:
		return problem("DecompressMaxBytes", "must be at least 1, got %d", c.DecompressMaxBytes)
	case c.FetchMaxPartitionBytes < 1:
		return problem("FetchMaxPartitionBytes", "must be at least 1, got %d", c.FetchMaxPartitionBytes)
	case c.BatchMaxRows < 1:
		return problem("BatchMaxRows", "must be at least 1, got %d", c.BatchMaxRows)
	case c.BatchMaxBytes < 1:
		return problem("BatchMaxBytes", "must be at least 1, got %d", c.BatchMaxBytes)
	case c.BatchMaxAge <= 0:
		return problem("BatchMaxAge", "must be positive, got %s", c.BatchMaxAge)
	case c.Warehouse.DSN == "":
		return problem("Warehouse.DSN", "is required")
	case c.usesRegistry() && c.SchemaRegistry == nil:
		return problem("SchemaRegistry", "is required: a source reads the schema registry")
	case c.usesRegistry() && c.RegistryTimeout <= 0:
		return problem("RegistryTimeout", "must be positive, got %s", c.RegistryTimeout)
	}
	if err := c.validateReplay(); err != nil {
		return err
	}
	topics := map[string]string{}
	for _, s := range c.Sources {
		if err := s.validate(); err != nil {
			return err
		}
		for _, t := range s.Topics {
			if other, ok := topics[t]; ok {
				return fmt.Errorf("ingest: source %s: Topics: topic %s is also a topic of source %s", s.Name, t, other)
			}
			topics[t] = s.Name
		}
	}
	return nil
}

// validateReplay reports the first setting of c, beyond its sources', that
// Replay cannot work with.
func (c *Config) validateReplay() error {
	switch {
	case c.Group == "":
		return errors.New("ingest: Group is required")
	case c.WriteTimeout <= 0:
		return fmt.Errorf("ingest: WriteTimeout must be positive, got %s", c.WriteTimeout)
	}
	return nil
}

// validate reports the first setting of s that its ingester cannot work
// with.
func (s *Source) validate() error {
	problem := func(field, format string, args ...any) error {
		return fmt.Errorf("ingest: source %s: %s %s", s.Name, field, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Name == "":
		return errors.New("ingest: a source's Name is required")
	case len(s.Topics) == 0:
		return problem("Topics", "needs at least one topic")
	case s.Decoding == nil:
		return problem("Decoding", "is required")
	case s.RawPartition != config.PartitionDay && s.RawPartition != config.PartitionMonth:
		return problem("RawPartition", "must be %s or %s, got %q", config.PartitionDay, config.PartitionMonth, s.RawPartition)
	case s.DedupeWindow < 0:
		return problem("DedupeWindow", "must not be negative, got %s", s.DedupeWindow)
	}
	return nil
}
