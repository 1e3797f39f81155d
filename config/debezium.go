package config

import "github.com/jackc/pgx/v5"

// validateDebeziumSource checks a Kafka source of format debezium: its
// event ids and times come from the change events, so the keys that say
// where they are do not apply, and it needs a mirror.
func (c *Config) validateDebeziumSource(ix *index, p string, s *Source) {
	for key, set := range map[string]bool{
		"event_id":            s.EventID != "",
		"event_id_fallback":   s.EventIDFallback != "",
		"event_time":          s.EventTime != "",
		"event_time_fallback": s.EventTimeFallback != "",
		"event_time_format":   s.EventTimeFormat != "",
		"max_age":             s.MaxAge != 0,
		"max_future_skew":     s.MaxFutureSkew != 0,
	} {
		if set {
			ix.add(p+"."+key, "does not apply to format: debezium: a change's event id is its source position and its event time the source commit time (source.ts_ms)")
		}
	}
	if s.Dedupe != nil {
		ix.add(p+".dedupe", "does not apply to format: debezium: a change sent again has the same source position, and is stored once")
	}
	if s.Mirror == nil {
		ix.add(p+".mirror", "is required for format: debezium: mirror: {table: NAME}")
	}
}

// validateDebeziumMirror checks the mirror block of a Debezium source.
func (c *Config) validateDebeziumMirror(ix *index, p string, s *Source, tables map[string]string) {
	m := s.Mirror
	if m.Schema != "" {
		ix.add(p+".mirror.schema", "applies to CDC sources; a Debezium source's mirror is mirror.table")
	}
	c.validateMirror(ix, p, s, tables)
	if m.Deletes == DeletesHard {
		ix.add(p+".mirror.deletes", "must be soft for format: debezium: a deleted row keeps the source position of its delete, "+
			"so that a change the connector sends again cannot bring it back")
	}
	switch {
	case !identRe.MatchString(m.PositionColumn):
		ix.add(p+".mirror.position_column", "%q is not a column name", m.PositionColumn)
	case m.PositionColumn == m.DeletedColumn || m.PositionColumn == m.LoadedColumn:
		ix.add(p+".mirror.position_column", "must differ from mirror.deleted_column and mirror.loaded_column")
	}
	switch {
	case m.SourceDSN != "" && m.SourceTable == "":
		ix.add(p+".mirror.source_table", "source_dsn needs source_table: the table at the source the connector reads")
	case m.SourceTable != "" && !ValidTableName(m.SourceTable):
		ix.add(p+".mirror.source_table", "must be a table name such as customers or public.customers (lower-case identifiers), got %q", m.SourceTable)
	case m.SourceDSN != "":
		if _, err := pgx.ParseConfig(m.SourceDSN); err != nil {
			ix.add(p+".mirror.source_dsn", "is not a valid PostgreSQL connection string: %s", redactErr(err))
		}
	}
	if m.KeyReconcileEvery != 0 {
		ix.add(p+".mirror.key_reconcile_every", "applies to poll sources: a Debezium source's deletes arrive as change events")
	}
	if m.KeyReconcileMaxDelete != nil {
		ix.add(p+".mirror.key_reconcile_max_delete", "applies to poll sources")
	}
}
