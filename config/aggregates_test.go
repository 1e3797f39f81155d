package config

import (
	"strings"
	"testing"
	"time"
)

// aggregateBase is a valid configuration with one Kafka source, one table
// source and one aggregate; tests replace parts of it.
const aggregateBase = `warehouse: {dsn: postgres://h/db}
kafka: {brokers: [h:9092]}
sources:
  app_events:
    kafka: {topics: [t]}
    event_id: /id
    event_time: /ts
  partner:
    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at, lookback: 30m}
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date, time_zone: America/New_York}
    sql: SELECT {{partition}} AS sale_date, count(*) AS n FROM {{events}} GROUP BY 1
`

func TestAggregateDefaults(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(aggregateBase), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Aggregates["daily_sales"]
	if a.Name != "daily_sales" || a.LatenessHorizon.Duration() != 72*time.Hour || a.BeyondHorizon != PolicyCorrection {
		t.Errorf("defaults: %+v horizon %v", a, a.LatenessHorizon)
	}
	if a.Partition.Location().String() != "America/New_York" {
		t.Errorf("location %v", a.Partition.Location())
	}
	if cfg.Reconcile.Every.Duration() != time.Minute || cfg.Reconcile.MaxPartitionsPerRun != 100 || cfg.Reconcile.RunTimeout.Duration() != 10*time.Minute {
		t.Errorf("reconcile defaults: %+v", cfg.Reconcile)
	}
	if ts := cfg.Sources["partner"].Table; ts == nil || ts.Lookback.Duration() != 30*time.Minute || ts.SafetyLag != 0 {
		t.Errorf("table source: %+v", ts)
	}
	// An explicit zero horizon stays zero.
	zero := strings.Replace(aggregateBase, "    source: app_events\n    table", "    source: app_events\n    lateness_horizon: 0\n    table", 1)
	cfg, err = Parse("t.yaml", []byte(zero), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.Aggregates["daily_sales"].LatenessHorizon.Duration(); h != 0 {
		t.Errorf("lateness_horizon: 0 became %v", h)
	}
	// The longest horizon is a year of 366 days.
	year := strings.Replace(aggregateBase, "    source: app_events\n    table", "    source: app_events\n    lateness_horizon: 366d\n    table", 1)
	cfg, err = Parse("t.yaml", []byte(year), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.Aggregates["daily_sales"].LatenessHorizon.Duration(); h != 366*24*time.Hour {
		t.Errorf("lateness_horizon: 366d became %v", h)
	}
}

func noEnv(string) (string, bool) { return "", false }

func TestAggregateErrors(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{
		{"unknown source", "    source: app_events\n", "    source: nope\n", `t.yaml:12: aggregates.daily_sales.source: no source is named "nope"`},
		{"missing source", "    source: app_events\n", "", "aggregates.daily_sales.source: is required"},
		{"bad table", "table: daily_sales", "table: Daily-Sales", "t.yaml:13: aggregates.daily_sales.table: must be a table name"},
		{"tidemark's schema", "table: daily_sales", "table: raw.daily_sales", "aggregates.daily_sales.table: schema raw belongs to tidemark"},
		{"a shadow table's name", "table: daily_sales", "table: reports.sales__shadow", "aggregates.daily_sales.table: names ending in __shadow are kept"},
		{"granularity", "by: day", "by: week", `t.yaml:14: aggregates.daily_sales.partition.by: must be one of hour, day, month, got "week"`},
		{"column", "column: sale_date", "column: Sale-Date", "aggregates.daily_sales.partition.column: must name the target column"},
		{"time zone", "time_zone: America/New_York", "time_zone: Mars/Olympus", `aggregates.daily_sales.partition.time_zone: "Mars/Olympus" is not an IANA time zone`},
		{"policy", "    sql:", "    beyond_horizon: ignore\n    sql:", `aggregates.daily_sales.beyond_horizon: must be one of correction, arrival, rebuild, got "ignore"`},
		{"negative horizon", "    sql:", "    lateness_horizon: -1h\n    sql:", "t.yaml:15: aggregates.daily_sales.lateness_horizon: must be between 0 and 366d, got -1h"},
		{"horizon beyond a year", "    sql:", "    lateness_horizon: 367d\n    sql:", "t.yaml:15: aggregates.daily_sales.lateness_horizon: must be between 0 and 366d, got 367d"},
		{"horizon just beyond a year", "    sql:", "    lateness_horizon: 366d1s\n    sql:", "aggregates.daily_sales.lateness_horizon: must be between 0 and 366d, got 366d1s"},
		{"horizon of 292 years", "    sql:", "    lateness_horizon: 106751d\n    sql:", "aggregates.daily_sales.lateness_horizon: must be between 0 and 366d, got 106751d"},
		{"horizon in hours", "    sql:", "    lateness_horizon: 2562047h\n    sql:", "aggregates.daily_sales.lateness_horizon: must be between 0 and 366d"},
		{"no events", "FROM {{events}} GROUP BY 1", "FROM raw.app_events GROUP BY 1", "aggregates.daily_sales.sql: must read {{events}}"},
		{"semicolon", "GROUP BY 1\n", "GROUP BY 1;\n", "aggregates.daily_sales.sql: must be one SELECT without a trailing semicolon"},
		{"placeholder", "{{partition}} AS", "{{part}} AS", "aggregates.daily_sales.sql: unknown placeholder {{part}}"},
		{"reconcile interval", "aggregates:\n", "reconcile: {every: 10ms}\naggregates:\n", "reconcile.every: must be at least 1s"},
		{"both kinds", "    table: {name: partner.sales", "    kafka: {topics: [u]}\n    table: {name: partner.sales", "sources.partner: has more than one of the kafka, table, poll and cdc blocks"},
		{"table name", "name: partner.sales", "name: partner.sales.x", "sources.partner.table.name: must be a table name"},
		{"key", "key: [id]", "key: []", "sources.partner.table.key: at least one key column is required"},
		{"time column", "ingested_at: loaded_at", "ingested_at: Loaded At", "sources.partner.table.ingested_at: must name a timestamptz column"},
		{"lookback", "lookback: 30m", "lookback: -30m", "sources.partner.table.lookback: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(aggregateBase, tt.old) {
				t.Fatalf("base lacks %q", tt.old)
			}
			_, err := Parse("t.yaml", []byte(strings.Replace(aggregateBase, tt.old, tt.new, 1)), noEnv)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}
