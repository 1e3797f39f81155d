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
	if p.Every.Duration() != time.Minute || p.ChunkRows != 10000 || p.MaxRowsPerRun != 1_000_000 || p.Lookback.Duration() != 30*time.Minute || p.SafetyLag.Duration() != time.Minute {
		t.Errorf("poll defaults: %+v", p)
	}
	if p.Location() != nil {
		t.Errorf("no time_zone configured, got %v", p.Location())
	}
	if m.Deletes != DeletesSoft || m.DeletedColumn != "deleted_at" || m.LoadedColumn != "loaded_at" || m.KeyReconcileEvery.Duration() != time.Hour {
		t.Errorf("mirror defaults: %+v", m)
	}
	if d := m.KeyReconcileMaxDelete; d == nil || *d != DefaultKeyReconcileMaxDelete || d.String() != "10%" {
		t.Errorf("mirror.key_reconcile_max_delete default = %v, want 10%%", d)
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
		{"max delete ratio", "key_reconcile_every: 1h", "key_reconcile_max_delete: 0.1", `t.yaml:11: sources.customers.mirror.key_reconcile_max_delete: invalid percentage "0.1" (use e.g. 10%`},
		{"max delete without unit", "key_reconcile_every: 1h", "key_reconcile_max_delete: 10", `sources.customers.mirror.key_reconcile_max_delete: invalid percentage "10"`},
		{"max delete precision", "key_reconcile_every: 1h", "key_reconcile_max_delete: 0.125%", `sources.customers.mirror.key_reconcile_max_delete: invalid percentage "0.125%"`},
		{"max delete negative", "key_reconcile_every: 1h", "key_reconcile_max_delete: -5%", `sources.customers.mirror.key_reconcile_max_delete: invalid percentage "-5%"`},
		{"max delete above 100%", "key_reconcile_every: 1h", "key_reconcile_max_delete: 150%", "t.yaml:11: sources.customers.mirror.key_reconcile_max_delete: must be between 0% and 100% (100% turns the limit off), got 150%"},
		{"max delete list", "key_reconcile_every: 1h", "key_reconcile_max_delete: [10%]", "sources.customers.mirror.key_reconcile_max_delete: expected a percentage such as 10%"},
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

// TestKeyReconcileMaxDelete: mirror.key_reconcile_max_delete is a
// percentage of the mirror's live rows, rounded up to whole rows.
func TestKeyReconcileMaxDelete(t *testing.T) {
	for _, tt := range []struct {
		value string
		want  Percent
		text  string
		// of maps mirror rows to the rows a run may flag or remove.
		of map[int64]int64
	}{
		{value: "10%", want: 1000, text: "10%", of: map[int64]int64{0: 0, 1: 1, 3: 1, 10: 1, 11: 2, 100: 10, 101: 11, 2_000_000: 200_000}},
		{value: "0%", want: 0, text: "0%", of: map[int64]int64{0: 0, 1: 0, 1_000_000: 0}},
		{value: "100%", want: 10000, text: "100%", of: map[int64]int64{0: 0, 7: 7, 1 << 60: 1 << 60}},
		{value: "2.5%", want: 250, text: "2.5%", of: map[int64]int64{40: 1, 41: 2, 1000: 25}},
		{value: "0.25%", want: 25, text: "0.25%", of: map[int64]int64{400: 1, 401: 2}},
		{value: "'7.50%'", want: 750, text: "7.5%", of: map[int64]int64{200: 15}},
	} {
		t.Run(tt.value, func(t *testing.T) {
			cfg, err := Parse("t.yaml", []byte(strings.Replace(pollBase, "key_reconcile_every: 1h", "key_reconcile_max_delete: "+tt.value, 1)), noEnv)
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Sources["customers"].Mirror.KeyReconcileMaxDelete
			if got == nil || *got != tt.want || got.String() != tt.text {
				t.Fatalf("parsed %v, want %d (%s)", got, tt.want, tt.text)
			}
			for n, want := range tt.of {
				if rows := got.Of(n); rows != want {
					t.Errorf("%s of %d rows = %d, want %d", got, n, rows, want)
				}
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
		c.HeartbeatEvery.Duration() != time.Minute || c.SnapshotWorkers != 2 || c.SnapshotChunkRows != 250000 || c.ResyncChunkRows != 10000 || c.StatusEvery.Duration() != 10*time.Second || s.RawPartition != PartitionMonth || s.Mirror.Deletes != DeletesSoft {
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
		{"key reconcile max delete", "mirror: {schema: mirror}", "mirror: {schema: mirror, key_reconcile_max_delete: 100%}", "sources.shop.mirror.key_reconcile_max_delete: applies to poll sources"},
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
