package config

import (
	"strings"
	"testing"
	"time"
)

// pollBase is a valid configuration with one poll source.
const pollBase = `warehouse: {dsn: postgres://h/db}
sources:
  customers:
    poll:
      dsn: postgres://src/db
      table: public.src_customers
      key: [customer_id]
      updated_at: updated_at
      lookback: 30m
      safety_lag: 1m
    mirror: {table: dw_customers, key_reconcile_every: 1h}
`

func TestPollDefaults(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(pollBase), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sources["customers"]
	p, m := s.Poll, s.Mirror
	if p.Every.D() != time.Minute || p.ChunkRows != 10000 || p.MaxRowsPerRun != 1_000_000 || p.Lookback.D() != 30*time.Minute || p.SafetyLag.D() != time.Minute {
		t.Errorf("poll defaults: %+v", p)
	}
	if p.Location() != nil {
		t.Errorf("no time_zone configured, got %v", p.Location())
	}
	if m.Deletes != DeletesSoft || m.DeletedColumn != "deleted_at" || m.LoadedColumn != "loaded_at" || m.KeyReconcileEvery.D() != time.Hour {
		t.Errorf("mirror defaults: %+v", m)
	}
	if s.RawPartition != PartitionMonth {
		t.Errorf("raw_partition default for a poll source = %s, want month", s.RawPartition)
	}
}

func TestPollErrors(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{
		{"no dsn", "      dsn: postgres://src/db\n", "", "t.yaml:4: sources.customers.poll.dsn: is required"},
		{"table", "table: public.src_customers", "table: Src Customers", "sources.customers.poll.table: must be a table name"},
		{"no key", "key: [customer_id]", "key: []", "sources.customers.poll.key: at least one key column is required"},
		{"twice", "key: [customer_id]", "key: [customer_id, customer_id]", "t.yaml:7: sources.customers.poll.key[1]: column customer_id is listed twice"},
		{"updated_at", "updated_at: updated_at", "updated_at: ''", "sources.customers.poll.updated_at: must name the source's update-time column"},
		{"updated_at in key", "updated_at: updated_at", "updated_at: customer_id", "sources.customers.poll.updated_at: must not be a key column"},
		{"zone", "      lookback", "      time_zone: Mars/Base\n      lookback", `sources.customers.poll.time_zone: "Mars/Base" is not an IANA time zone`},
		{"lookback", "lookback: 30m", "lookback: -30m", "t.yaml:9: sources.customers.poll.lookback: must not be negative"},
		{"every", "safety_lag: 1m", "safety_lag: 1m\n      every: 10ms", "sources.customers.poll.every: must be at least 1s"},
		{"chunk", "safety_lag: 1m", "safety_lag: 1m\n      chunk_rows: -1", "sources.customers.poll.chunk_rows: must be between 1 and 1000000"},
		{"no mirror", "    mirror: {table: dw_customers, key_reconcile_every: 1h}\n", "", "sources.customers.mirror: is required for a poll source"},
		{"mirror table", "table: dw_customers", "table: raw.customers", "sources.customers.mirror.table: schema raw belongs to tidemark"},
		{"deletes", "key_reconcile_every: 1h", "deletes: maybe", `sources.customers.mirror.deletes: must be one of soft, hard, got "maybe"`},
		{"reconcile interval", "key_reconcile_every: 1h", "key_reconcile_every: 5s", "sources.customers.mirror.key_reconcile_every: must be 0 (off) or at least 1m"},
		{"same columns", "key_reconcile_every: 1h", "loaded_column: deleted_at", "sources.customers.mirror.loaded_column: must differ from mirror.deleted_column"},
		{"two kinds", "    poll:\n", "    kafka: {topics: [t]}\n    poll:\n", "sources.customers: has more than one of the kafka, table, poll and cdc blocks"},
		{"pointers", "    mirror:", "    event_id: /id\n    mirror:", "sources.customers: event_id and event_time pointers apply to Kafka sources"},
		{"aggregate on the mirror", "key_reconcile_every: 1h}\n", "key_reconcile_every: 1h}\naggregates:\n  a:\n    source: customers\n    table: dw_customers\n    partition: {by: day, column: d}\n    sql: SELECT 1 AS d FROM {{events}}\n",
			"aggregates.a.table: table public.dw_customers is the mirror of sources.customers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(pollBase, tt.old) {
				t.Fatalf("base lacks %q", tt.old)
			}
			_, err := Parse("t.yaml", []byte(strings.Replace(pollBase, tt.old, tt.new, 1)), noEnv)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// cdcBase is a valid configuration with one CDC source.
const cdcBase = `warehouse: {dsn: postgres://h/db}
sources:
  shop:
    cdc:
      dsn: postgres://src/db
      tables: [public.customers, orders]
    mirror: {schema: mirror}
`

func TestCDCConfig(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(cdcBase), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sources["shop"]
	c := s.CDC
	if c.Slot != "tidemark_shop" || c.Publication != "tidemark_shop" || c.Snapshot != SnapshotInitial || c.Truncate != TruncateApply ||
		c.HeartbeatEvery.D() != time.Minute || c.SnapshotWorkers != 2 || c.SnapshotChunkRows != 250000 || c.StatusEvery.D() != 10*time.Second || s.RawPartition != PartitionMonth || s.Mirror.Deletes != DeletesSoft {
		t.Errorf("defaults: %+v %+v", c, s.Mirror)
	}
	if got := s.MirrorTables(); got["public.customers"] != "mirror.customers" || got["public.orders"] != "mirror.orders" {
		t.Errorf("mirror tables %v", got)
	}
	tests := []struct{ name, old, new, want string }{
		{"no dsn", "      dsn: postgres://src/db\n", "", "sources.shop.cdc.dsn: is required"},
		{"no tables", "tables: [public.customers, orders]", "tables: []", "sources.shop.cdc.tables: at least one table"},
		{"twice", "tables: [public.customers, orders]", "tables: [customers, public.customers]", "sources.shop.cdc.tables[1]: table public.customers is listed twice"},
		{"slot", "      tables:", "      slot: Bad-Slot\n      tables:", "sources.shop.cdc.slot: must match"},
		{"snapshot", "      tables:", "      snapshot: later\n      tables:", `sources.shop.cdc.snapshot: must be one of initial, never, got "later"`},
		{"snapshot workers", "      tables:", "      snapshot_workers: 40\n      tables:", "sources.shop.cdc.snapshot_workers: must be between 1 and 32, got 40"},
		{"snapshot chunk", "      tables:", "      snapshot_chunk_rows: 10\n      tables:", "sources.shop.cdc.snapshot_chunk_rows: must be at least 1000, got 10"},
		{"key reconcile", "mirror: {schema: mirror}", "mirror: {schema: mirror, key_reconcile_every: 1h}", "sources.shop.mirror.key_reconcile_every: applies to poll sources"},
		{"one mirror for two tables", "mirror: {schema: mirror}", "mirror: {table: dw}", "sources.shop.mirror.table: names one mirror but cdc.tables lists 2 tables"},
		{"no mirror", "    mirror: {schema: mirror}\n", "", "sources.shop.mirror: is required for a CDC source"},
		{"tidemark schema", "mirror: {schema: mirror}", "mirror: {schema: raw}", "sources.shop.mirror.schema: schema raw belongs to tidemark"},
		{"shared slot", "    mirror: {schema: mirror}\n", "    mirror: {schema: mirror}\n  stock:\n    cdc: {dsn: postgres://other/db, slot: tidemark_shop, tables: [items]}\n    mirror: {schema: stock}\n",
			`sources.stock.cdc.slot: slot "tidemark_shop" is also the slot of source shop`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(strings.Replace(cdcBase, tt.old, tt.new, 1)), noEnv)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}
