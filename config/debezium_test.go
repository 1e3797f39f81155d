package config

import "testing"

// dbzBase is a valid Debezium source of seven lines; extra lines start at
// line 8.
func dbzBase(extra ...string) string {
	return lines(append([]string{
		"warehouse: {dsn: postgres://h/db}",          // 1
		"kafka: {brokers: [localhost:9092]}",         // 2
		"sources:",                                   // 3
		"  customers:",                               // 4
		"    kafka: {topics: [pg.public.customers]}", // 5
		"    format: debezium",                       // 6
		"    mirror: {table: dw.customers}",          // 7
	}, extra...)...)
}

// TestDebeziumSource parses sources.<name>.format: debezium: the defaults
// it takes, and the keys it refuses, each by its name.
func TestDebeziumSource(t *testing.T) {
	tests := []struct {
		name string
		data string
		want []wantErr
	}{
		{"valid", dbzBase(), nil},
		{"valid with a registry, for the AvroConverter", dbzBase("schema_registry: {url: http://registry:8081}"), nil},
		{"registry timeout against the rebalance", dbzBase("schema_registry: {url: http://registry:8081, timeout: 30s}"),
			[]wantErr{{8, "schema_registry.timeout", "must be less than half of kafka.rebalance_timeout"}}},
		{"event pointers refused", dbzBase("    event_id: /id", "    event_time: /ts"), []wantErr{
			{8, "sources.customers.event_id", "does not apply to format: debezium"},
			{9, "sources.customers.event_time", "does not apply to format: debezium"}}},
		{"max_age refused", dbzBase("    max_age: 30d"), []wantErr{{8, "sources.customers.max_age", "does not apply to format: debezium"}}},
		{"dedupe refused", dbzBase("    dedupe: {by: event_id, window: 7d}"), []wantErr{{8, "sources.customers.dedupe", "does not apply to format: debezium"}}},
		{"mirror required", lines("warehouse: {dsn: postgres://h/db}", "kafka: {brokers: [localhost:9092]}", "sources:", "  customers:",
			"    kafka: {topics: [t]}", "    format: debezium"), []wantErr{{4, "sources.customers.mirror", "is required for format: debezium"}}},
		{"hard deletes refused", lines("warehouse: {dsn: postgres://h/db}", "kafka: {brokers: [localhost:9092]}", "sources:", "  customers:",
			"    kafka: {topics: [t]}", "    format: debezium", "    mirror: {table: c, deletes: hard}"),
			[]wantErr{{7, "sources.customers.mirror.deletes", "must be soft for format: debezium"}}},
		{"position column clash", lines("warehouse: {dsn: postgres://h/db}", "kafka: {brokers: [localhost:9092]}", "sources:", "  customers:",
			"    kafka: {topics: [t]}", "    format: debezium", "    mirror: {table: c, position_column: loaded_at}"),
			[]wantErr{{7, "sources.customers.mirror.position_column", "must differ from"}}},
		{"unknown format", lines("warehouse: {dsn: postgres://h/db}", "kafka: {brokers: [localhost:9092]}", "sources:", "  customers:",
			"    kafka: {topics: [t]}", "    format: maxwell"), []wantErr{{6, "sources.customers.format", `must be one of json, avro, protobuf, json_schema, debezium, got "maxwell"`}}},
		{"mirror on a JSON source", base("    mirror: {table: c}"), []wantErr{{11, "sources.app_events.mirror", "applies to poll, CDC and Debezium sources only"}}},
		{"position column on a CDC source", lines("warehouse: {dsn: postgres://h/db}", "sources:", "  customers:",
			"    cdc: {dsn: postgres://src/db, tables: [customers]}", "    mirror: {schema: dw, position_column: pos}"),
			[]wantErr{{5, "sources.customers.mirror.position_column", "applies to Debezium sources (format: debezium) only"}}},
		{"source dsn without source table", lines("warehouse: {dsn: postgres://h/db}", "kafka: {brokers: [localhost:9092]}", "sources:", "  customers:",
			"    kafka: {topics: [t]}", "    format: debezium", "    mirror: {table: c, source_dsn: postgres://src/db}"),
			[]wantErr{{7, "sources.customers.mirror.source_table", "source_dsn needs source_table"}}},
		{"source dsn on a poll source", lines("warehouse: {dsn: postgres://h/db}", "sources:", "  customers:",
			"    poll: {dsn: postgres://src/db, table: customers, key: [id], updated_at: updated_at}",
			"    mirror: {table: c, source_dsn: postgres://src/db}"),
			[]wantErr{{5, "sources.customers.mirror.source_dsn", "applies to Debezium sources (format: debezium) only"}}},
		{"format on a poll source", pollBase + "    format: debezium\n", []wantErr{{12, "sources.customers.format", "applies to Kafka sources only"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want != nil {
				checkErrors(t, parseErrors(t, tt.data, nil), tt.want)
				return
			}
			cfg, err := Parse(file, []byte(tt.data), envLookup(nil))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			s := cfg.Sources["customers"]
			if s.Kind() != KindDebezium || !s.Kind().RowChanges() {
				t.Errorf("Kind() == KindDebezium: %v, RowChanges(): %v; want both true", s.Kind() == KindDebezium, s.Kind().RowChanges())
			}
			if s.RawPartition != PartitionMonth || s.Mirror.PositionColumn != "source_position" || s.Mirror.Deletes != DeletesSoft {
				t.Errorf("defaults: raw_partition %q, position_column %q, deletes %q", s.RawPartition, s.Mirror.PositionColumn, s.Mirror.Deletes)
			}
			if s.EventTimeFormat != "" || s.MaxAge != 0 || s.MaxFutureSkew != 0 {
				t.Errorf("event keys took defaults: %q %s %s", s.EventTimeFormat, s.MaxAge, s.MaxFutureSkew)
			}
		})
	}
}
