package config

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Key is one key of the configuration file: where it is, its default and
// the values it accepts. The table keys declares every key once: Parse
// fills the defaults from it, the validation checks the bounds and values
// it gives, and docs/configuration.md shows its Type, Default and Allowed
// columns, which the documentation test compares with Keys.
type Key struct {
	// Path is the dotted YAML path, <name> standing for the keys of a
	// map: sources.<name>.retention.raw.
	Path string
	// Type names the value type as the reference does: string, integer,
	// boolean, duration, size, percentage, JSON pointer or list of
	// strings. It follows from the Go type of the field; the table states
	// it only for JSON pointers.
	Type string
	// Default is the value the key takes when it is left out, written as
	// in the file: 72h, 400d, 8, true, tidemark_<name> (the map key fills
	// <name>). Empty: the key has no default.
	Default string
	// Env names an environment variable whose value a key left out (or
	// empty) takes.
	Env string
	// Note qualifies the default in the reference: "required", "system
	// roots", "`month` for poll and CDC sources".
	Note string
	// KeepZero gives the default to a key left out only: a key written
	// as 0 keeps that value. Without it, 0 (or "") written in the file
	// selects the default too. A boolean always keeps false.
	KeepZero bool
	// Zero, when set, allows 0 besides Min..Max and says what it means:
	// "off", "the server's setting".
	Zero string
	// Min and Max bound the value, written like it (1s, 1KiB, 2, 10%).
	// Max may name another key instead, whose value bounds this one; a
	// default above it is lowered to it.
	Min, Max string
	// OneOf lists the values accepted; "" among them allows leaving the
	// key empty.
	OneOf []string
	// Allowed describes what the key accepts beyond Min, Max and OneOf,
	// as the reference says it.
	Allowed string
	// Why follows the bounds in an error: " (raw partitions are dropped
	// whole)".
	Why string

	// defaultIn, when set, gives the default of the key in source s (nil
	// outside sources) from the table's def: "" for none.
	defaultIn func(c *Config, s *Source, def string) string
}

// postgresLimit explains the bound of the PostgreSQL session settings.
const postgresLimit = " (about 24.8 days, PostgreSQL's limit)"

// pollAndCDC gives month partitions to poll, CDC and Debezium sources: rows of a
// table's history span years, and day partitions would be many and small.
func pollAndCDC(_ *Config, s *Source, def string) string {
	if s.Kind().RowChanges() {
		return PartitionMonth
	}
	return def
}

// notDebezium leaves a key of how events are read without a default on a
// Debezium source, which refuses it: its event ids and times come from
// the change events.
func notDebezium(_ *Config, s *Source, def string) string {
	if s.Kind() == KindDebezium {
		return ""
	}
	return def
}

// kafkaOnly gives the default to Kafka sources only.
func kafkaOnly(_ *Config, s *Source, def string) string {
	if s.Kafka != nil && s.Table == nil && s.Poll == nil && s.CDC == nil {
		return def
	}
	return ""
}

// keys is every key of the file, in the order of the reference. Defaults
// are filled in this order, so a key whose bound names another key comes
// after it.
var keys = []Key{
	{Path: "warehouse.dsn", Env: EnvDatabaseURL, Allowed: "a PostgreSQL connection string"},
	{Path: "warehouse.dsn_file", Allowed: "a file holding `dsn` ([secrets in files](#secrets-in-files))"},
	{Path: "warehouse.migrate", Default: "true"},
	{Path: "warehouse.distribute", Default: "true"},
	{Path: "warehouse.max_conns", Default: "8", Min: "2", Max: "1000"},
	{Path: "warehouse.statement_timeout", Default: "0", Zero: "the server's setting", Min: "1ms", Max: "2147483647ms", Why: postgresLimit},
	{Path: "warehouse.lock_timeout", Default: "0", Zero: "the server's setting", Min: "1ms", Max: "2147483647ms", Why: postgresLimit},
	{Path: "warehouse.idle_in_transaction_session_timeout", Default: "5m", KeepZero: true, Zero: "the server's setting",
		Min: "1s", Max: "2147483647ms", Why: postgresLimit},
	{Path: "warehouse.write_timeout", Default: "2m", Min: "100ms", Max: "2147483647ms",
		Why: " (about 24.8 days: the ingester's sessions carry it as statement_timeout, which PostgreSQL limits to that)"},

	{Path: "http.listen", Default: "127.0.0.1:9187", Allowed: "`host:port` or `off`"},
	{Path: "http.token", Allowed: "a bearer token of at least 16 characters: letters, digits and `-._~+/`, then optionally `=` padding"},
	{Path: "http.token_file", Allowed: "a file holding `token` ([secrets in files](#secrets-in-files))"},

	{Path: "log.level", Default: "info", OneOf: []string{"debug", "info", "warn", "error"}},
	{Path: "log.format", Default: "text", OneOf: []string{"text", "json"}},

	{Path: "kafka.brokers", Note: "required with Kafka sources", Allowed: "`host:port` each"},
	{Path: "kafka.group", Default: "tidemark"},
	{Path: "kafka.client_id", Default: "tidemark"},
	{Path: "kafka.start_offset", Default: "earliest", OneOf: []string{"earliest", "latest"}},
	{Path: "kafka.session_timeout", Default: "45s", Min: "100ms"},
	{Path: "kafka.rebalance_timeout", Default: "60s", Min: "100ms"},
	// The fetch the client holds is one third of the records' memory,
	// decompressed (the client asks for less when the records compress).
	{Path: "kafka.fetch_max_bytes", Default: "6MiB", Note: "a third of `ingest.memory_max_bytes`", Min: "1KiB", Max: "1GiB",
		defaultIn: func(c *Config, _ *Source, _ string) string {
			return formatValue(reflect.ValueOf(third(c.Ingest.MemoryMaxBytes)))
		}},
	{Path: "kafka.fetch_max_partition_bytes", Default: "1MiB", Note: "or `kafka.fetch_max_bytes`, if smaller", Min: "1KiB", Max: "kafka.fetch_max_bytes"},

	{Path: "kafka.tls.enabled", Default: "true", Allowed: "`false` turns TLS off without removing the block"},
	{Path: "kafka.tls.ca_file", Note: "system roots", Allowed: "a PEM file of the certificate authorities to trust"},
	{Path: "kafka.tls.cert_file", Allowed: "a PEM client certificate; requires `key_file`"},
	{Path: "kafka.tls.key_file", Allowed: "the PEM private key of `cert_file`; requires `cert_file`"},
	{Path: "kafka.tls.server_name", Note: "the broker's host name", Allowed: "the name to verify in the broker certificates"},
	{Path: "kafka.tls.insecure_skip_verify", Default: "false", Allowed: "`true` does not verify the broker certificates (testing only)"},

	{Path: "kafka.sasl.mechanism", Note: "required", OneOf: []string{MechanismPlain, MechanismScram256, MechanismScram512, MechanismOAuthBearer, MechanismAWSMSKIAM}},
	{Path: "kafka.sasl.username", Note: "required", Allowed: "with `PLAIN` and `SCRAM-*`"},
	{Path: "kafka.sasl.password", Note: "required, or `password_file`", Allowed: "with `PLAIN` and `SCRAM-*`"},
	{Path: "kafka.sasl.password_file", Allowed: "a file holding `password`; with `PLAIN` and `SCRAM-*`"},
	{Path: "kafka.sasl.token_file", Note: "`token_file` or `token_command`", Allowed: "a file holding the token; with `OAUTHBEARER`"},
	{Path: "kafka.sasl.token_command", Allowed: "a program and its arguments; with `OAUTHBEARER`"},
	{Path: "kafka.sasl.token_command_timeout", Default: "10s", Min: "100ms", Allowed: "with `OAUTHBEARER`",
		defaultIn: func(c *Config, _ *Source, def string) string {
			if c.Kafka.SASL.Mechanism == MechanismOAuthBearer {
				return def
			}
			return "" // set, it is another mechanism's mistake
		}},
	{Path: "kafka.sasl.extensions.<name>", Allowed: "the value of the extension `<name>` (letters only); with `OAUTHBEARER`"},
	{Path: "kafka.sasl.access_key", Note: "`$AWS_ACCESS_KEY_ID`", Allowed: "with `AWS_MSK_IAM`"},
	{Path: "kafka.sasl.secret_key", Note: "`$AWS_SECRET_ACCESS_KEY`", Allowed: "with `AWS_MSK_IAM`"},
	{Path: "kafka.sasl.session_token", Note: "`$AWS_SESSION_TOKEN`", Allowed: "with `AWS_MSK_IAM`"},
	{Path: "kafka.sasl.allow_plaintext", Default: "false", Allowed: "`true` accepts SASL without TLS; not with `AWS_MSK_IAM`"},

	{Path: "schema_registry.url", Note: "required with a registry format", Allowed: "`http://` or `https://` URL of a Confluent-compatible registry"},
	{Path: "schema_registry.basic.username", Allowed: "HTTP basic authentication; requires `password` or `password_file`"},
	{Path: "schema_registry.basic.password", Allowed: "with `username`"},
	{Path: "schema_registry.basic.password_file", Allowed: "a file holding `password` ([secrets in files](#secrets-in-files))"},
	{Path: "schema_registry.bearer.token_file", Allowed: "a file holding a bearer token, read at each request; not with `basic`"},
	{Path: "schema_registry.tls.ca_file", Note: "system roots", Allowed: "a PEM file of the certificate authorities to trust"},
	{Path: "schema_registry.tls.cert_file", Allowed: "a PEM client certificate; requires `key_file`"},
	{Path: "schema_registry.tls.key_file", Allowed: "the PEM private key of `cert_file`; requires `cert_file`"},
	{Path: "schema_registry.tls.server_name", Note: "the URL's host name", Allowed: "the name to verify in the registry's certificate"},
	{Path: "schema_registry.tls.insecure_skip_verify", Default: "false", Allowed: "`true` does not verify the registry's certificate (testing only)"},
	// A poll waits up to two timeouts for the registry while it holds a
	// rebalance, which must be less than kafka.rebalance_timeout: left
	// out, the timeout is a quarter of it when that is less than 10s.
	{Path: "schema_registry.timeout", Default: "10s", Note: "or a quarter of `kafka.rebalance_timeout`, if smaller", Min: "100ms", Max: "1m",
		defaultIn: func(c *Config, _ *Source, def string) string {
			d, err := ParseDuration(def)
			if err != nil {
				panic("config: the default of schema_registry.timeout: " + err.Error())
			}
			return Duration(max(min(d, c.Kafka.RebalanceTimeout.Duration()/4), minRegistryTimeout)).String()
		}},

	// Left out, it holds the fetch and batch sizes written (a third of
	// the default each when not).
	{Path: "ingest.memory_max_bytes", Default: formatValue(reflect.ValueOf(DefaultMemoryMaxBytes)), Note: "or `kafka.fetch_max_bytes` plus twice `ingest.batch_max_bytes`, if more",
		Min: "1MiB", Max: "64GiB",
		defaultIn: func(c *Config, _ *Source, _ string) string { return formatValue(reflect.ValueOf(memoryDefault(c))) }},
	{Path: "ingest.batch_max_rows", Default: "50000", Min: "1", Max: "1000000"},
	{Path: "ingest.batch_max_bytes", Default: "6MiB", Note: "a third of `ingest.memory_max_bytes`", Min: "1KiB",
		defaultIn: func(c *Config, _ *Source, _ string) string { return formatValue(reflect.ValueOf(batchDefault(c))) }},
	{Path: "ingest.batch_max_age", Default: "1s", Min: "1ms"},
	// A record of a registry format or a Debezium change may decode to
	// at most decode_max_expansion times its size plus 64 KiB, and never
	// more than decode_max_bytes: one hostile record costs memory and
	// time in proportion to its size. 64 times covers what a schema adds
	// to its values (field names, nulls, defaults), and then a record at
	// Kafka's default size limit (1 MB) meets the default cap.
	{Path: "ingest.decode_max_bytes", Default: formatValue(reflect.ValueOf(DefaultDecodeMaxBytes)), Min: "1MiB", Max: "256MiB",
		Why: " (a jsonb value holds at most 256 MiB)"},
	{Path: "ingest.decode_max_expansion", Default: strconv.Itoa(DefaultDecodeMaxExpansion), Min: "1", Max: "65536"},

	{Path: "sources.<name>.kafka.topics", Note: "required", Allowed: "Kafka topic names, each read by one source"},
	{Path: "sources.<name>.format", Default: FormatJSON, OneOf: Formats,
		Allowed: "Kafka sources only", defaultIn: kafkaOnly},
	{Path: "sources.<name>.event_id", Type: "JSON pointer", Note: "required unless `event_id_fallback` is set; not with `format: debezium`"},
	{Path: "sources.<name>.event_id_fallback", OneOf: []string{"", FallbackCoordinates}},
	{Path: "sources.<name>.event_time", Type: "JSON pointer", Note: "required unless `event_time_fallback` is set; not with `format: debezium`"},
	{Path: "sources.<name>.event_time_format", Default: TimeAuto, OneOf: []string{TimeAuto, TimeRFC3339, TimeUnixSeconds, TimeUnixMillis},
		defaultIn: notDebezium},
	{Path: "sources.<name>.event_time_fallback", OneOf: []string{"", FallbackRecordTimestamp}},
	{Path: "sources.<name>.max_age", Default: "90d", Min: "0", defaultIn: notDebezium},
	{Path: "sources.<name>.max_future_skew", Default: "1h", Min: "0", defaultIn: notDebezium},
	{Path: "sources.<name>.raw_partition", Default: PartitionDay, Note: "`month` for poll, CDC and Debezium sources",
		OneOf: []string{PartitionDay, PartitionMonth}, defaultIn: pollAndCDC},
	{Path: "sources.<name>.watermark.out_of_orderness", Default: "0", Min: "0"},
	{Path: "sources.<name>.watermark.idle_timeout", Default: "5m", Min: "0"},
	{Path: "sources.<name>.retention.raw", Default: "400d", Min: "1d", Why: " (raw partitions are dropped whole)", Allowed: "not on table sources"},
	{Path: "sources.<name>.retention.dead_letters", Default: "30d", Min: "0", Allowed: "not on table sources"},
	{Path: "sources.<name>.dedupe.by", Default: DedupeNone, OneOf: []string{DedupeNone, DedupeEventID}, Allowed: "Kafka sources only"},
	// Ids are kept for the window: a shorter one would miss most
	// producer retries, a longer one keeps ids past any raw retention
	// that matters for lateness (the largest lateness horizon is 366d).
	{Path: "sources.<name>.dedupe.window", Note: "required with `by: event_id`", Min: "1h", Max: "366d",
		Why: " (ids are kept for the window: at least an hour to catch retries, at most the longest lateness horizon)"},

	{Path: "sources.<name>.cdc.dsn", Note: "required", Allowed: "a PostgreSQL connection string; the role needs `REPLICATION` and `SELECT` on the tables"},
	{Path: "sources.<name>.cdc.dsn_file", Allowed: "a file holding `dsn` ([secrets in files](#secrets-in-files))"},
	{Path: "sources.<name>.cdc.tables", Note: "required", Allowed: "`table` or `schema.table` (schema `public`), each once, each with a primary key"},
	{Path: "sources.<name>.cdc.publication", Default: "tidemark_<name>", Allowed: "a publication name; created when missing"},
	{Path: "sources.<name>.cdc.slot", Default: "tidemark_<name>", Allowed: "a replication slot name, one per source; created when missing"},
	{Path: "sources.<name>.cdc.snapshot", Default: SnapshotInitial, OneOf: []string{SnapshotInitial, SnapshotNever}},
	{Path: "sources.<name>.cdc.snapshot_workers", Default: "2", Min: "1", Max: "32"},
	{Path: "sources.<name>.cdc.snapshot_chunk_rows", Default: "250000", Min: "1000"},
	{Path: "sources.<name>.cdc.resync_chunk_rows", Default: "10000", Min: "100", Max: "1000000"},
	{Path: "sources.<name>.cdc.truncate", Default: TruncateApply, OneOf: []string{TruncateApply, TruncateIgnore}},
	{Path: "sources.<name>.cdc.heartbeat_every", Default: "1m", KeepZero: true, Zero: "off", Min: "1s"},
	{Path: "sources.<name>.cdc.status_every", Default: "10s", Min: "100ms", Max: "1m"},
	{Path: "sources.<name>.cdc.max_buffer_bytes", Default: "64MiB", Min: "1MiB"},
	{Path: "sources.<name>.cdc.failover_slot", Default: FailoverAuto, OneOf: []string{FailoverAuto, FailoverOn, FailoverOff}},
	{Path: "sources.<name>.cdc.standby_dsn", Allowed: "a standby of the source, PostgreSQL 17 or later, for the slot's checks ([failover](failover.md))"},
	{Path: "sources.<name>.cdc.standby_dsn_file", Allowed: "a file holding `standby_dsn` ([secrets in files](#secrets-in-files))"},
	{Path: "sources.<name>.cdc.primary_dsn", Allowed: "the primary, when `dsn` is a standby (PostgreSQL 16 or later): publication, heartbeats ([failover](failover.md))"},
	{Path: "sources.<name>.cdc.primary_dsn_file", Allowed: "a file holding `primary_dsn` ([secrets in files](#secrets-in-files))"},

	{Path: "sources.<name>.table.name", Note: "required", Allowed: "`name` or `schema.name`, lower-case SQL identifiers; the schema defaults to `public`"},
	{Path: "sources.<name>.table.key", Note: "required", Allowed: "one or more column names"},
	{Path: "sources.<name>.table.event_time", Note: "required", Allowed: "a `timestamptz` column"},
	{Path: "sources.<name>.table.ingested_at", Note: "required", Allowed: "a `timestamptz` column"},
	{Path: "sources.<name>.table.lookback", Default: "0", Min: "0"},
	{Path: "sources.<name>.table.safety_lag", Default: "0", Min: "0"},

	{Path: "sources.<name>.poll.dsn", Note: "required", Allowed: "a PostgreSQL connection string"},
	{Path: "sources.<name>.poll.dsn_file", Allowed: "a file holding `dsn` ([secrets in files](#secrets-in-files))"},
	{Path: "sources.<name>.poll.table", Note: "required", Allowed: "`name` or `schema.name`; the schema defaults to `public`"},
	{Path: "sources.<name>.poll.key", Note: "required", Allowed: "the columns of a primary key or unique index of the table"},
	{Path: "sources.<name>.poll.updated_at", Note: "required", Allowed: "a `timestamptz` column, or `timestamp` with `poll.time_zone`"},
	{Path: "sources.<name>.poll.time_zone", Allowed: "an IANA zone; only for a `timestamp without time zone` column"},
	{Path: "sources.<name>.poll.lookback", Default: "0", Min: "0"},
	{Path: "sources.<name>.poll.safety_lag", Default: "0", Min: "0"},
	{Path: "sources.<name>.poll.every", Default: "1m", Min: "1s"},
	{Path: "sources.<name>.poll.chunk_rows", Default: "10000", Min: "1", Max: "1000000"},
	{Path: "sources.<name>.poll.max_rows_per_run", Default: "1000000", Min: "1"},
	{Path: "sources.<name>.poll.soft_delete", Allowed: "a `boolean` or timestamp column"},

	{Path: "sources.<name>.mirror.table", Note: "required for poll and Debezium sources",
		Allowed: "`name` or `schema.name`, not in the schemas `raw` or `tidemark`; for a CDC source of one table, instead of `mirror.schema`"},
	{Path: "sources.<name>.mirror.schema", Default: "public", Note: "CDC sources without `mirror.table`",
		Allowed: "CDC sources: the schema of mirrors named like the source tables; not `raw` or `tidemark`",
		defaultIn: func(_ *Config, s *Source, def string) string {
			if s.CDC != nil && s.Mirror.Table == "" {
				return def
			}
			return ""
		}},
	{Path: "sources.<name>.mirror.deletes", Default: DeletesSoft, OneOf: []string{DeletesSoft, DeletesHard}},
	{Path: "sources.<name>.mirror.deleted_column", Default: "deleted_at", Allowed: "a column name the source does not have"},
	{Path: "sources.<name>.mirror.loaded_column", Default: "loaded_at", Allowed: "a column name the source does not have"},
	{Path: "sources.<name>.mirror.source_dsn", Allowed: "Debezium sources: the PostgreSQL database the connector reads, for `tidemark keys --dry-run`; with `source_table`"},
	{Path: "sources.<name>.mirror.source_dsn_file", Allowed: "a file holding `source_dsn` ([secrets in files](#secrets-in-files))"},
	{Path: "sources.<name>.mirror.source_table", Allowed: "Debezium sources: the table the connector reads, `table` (any schema or database) or `schema.table`; changes of other tables are dead letters"},
	{Path: "sources.<name>.mirror.position_column", Default: "source_position", Allowed: "Debezium sources only: a column name the source does not have",
		defaultIn: func(_ *Config, s *Source, def string) string {
			if s.Kind() == KindDebezium {
				return def
			}
			return ""
		}},
	{Path: "sources.<name>.mirror.key_reconcile_every", Default: "0", Zero: "off", Min: "1m", Allowed: "poll sources only"},
	{Path: "sources.<name>.mirror.key_reconcile_max_delete", Default: DefaultKeyReconcileMaxDelete.String(), Min: "0%", Max: "100%",
		Why: " (100% turns the limit off)", Allowed: "at most two decimals (`2.5%`); `100%` turns the limit off; poll sources only",
		defaultIn: func(_ *Config, s *Source, def string) string {
			if s.Poll != nil {
				return def
			}
			return "" // CDC sources: refused when set
		}},

	{Path: "aggregates.<name>.source", Note: "required", Allowed: "the name of a source"},
	{Path: "aggregates.<name>.table", Note: "required", Allowed: "`name` or `schema.name`, lower-case SQL identifiers; the schema defaults to `public`"},
	{Path: "aggregates.<name>.partition.by", Note: "required", OneOf: []string{PartitionHour, PartitionDay, PartitionMonth}},
	{Path: "aggregates.<name>.partition.column", Note: "required", Allowed: "a column name"},
	{Path: "aggregates.<name>.partition.time_zone", Default: "UTC", Allowed: "an IANA time zone name"},
	// A partition is open until its horizon has passed, and the raw
	// partitions it reads are kept until then whatever
	// sources.<name>.retention.raw says, so a longer horizon would keep
	// raw data and open partitions for years; lateness beyond a year is
	// better met by beyond_horizon or a backfill. With the default
	// retention.raw (400d) every raw partition a horizon keeps is past its
	// horizon before its retention ends, even for month partitions.
	{Path: "aggregates.<name>.lateness_horizon", Default: "72h", KeepZero: true, Min: "0", Max: "366d"},
	{Path: "aggregates.<name>.beyond_horizon", Default: PolicyCorrection, OneOf: []string{PolicyCorrection, PolicyArrival, PolicyRebuild}},
	{Path: "aggregates.<name>.sql", Note: "required", Allowed: "one `SELECT` over `{{events}}`"},
	{Path: "aggregates.<name>.verify_every", Default: "0", Zero: "none", Min: "1m"},
	{Path: "aggregates.<name>.refresh_every", Default: "0", Zero: "none", Min: "1m"},

	{Path: "reconcile.every", Default: "1m", Min: "1s"},
	{Path: "reconcile.max_partitions_per_run", Default: "100", Min: "1"},
	{Path: "reconcile.run_timeout", Default: "10m", Min: "1s"},

	{Path: "retention.every", Default: "1h", Min: "1s"},
	{Path: "retention.ledger", Default: "7d", Min: "0"},
	{Path: "retention.corrections", Default: "90d", Min: "0"},
	{Path: "retention.arrivals", Default: "90d", Min: "0"},
	{Path: "retention.runs", Default: "90d", Min: "0"},
	{Path: "retention.lock_timeout", Default: "2s", Min: "10ms", Max: "1m"},
}

func init() {
	root := reflect.TypeFor[Config]()
	for i := range keys {
		k := &keys[i]
		t, err := fieldType(root, strings.Split(k.Path, "."))
		if err != nil {
			panic(fmt.Sprintf("config: key %s: %v", k.Path, err))
		}
		if k.Type == "" {
			k.Type = typeName(t)
		}
	}
}

// Keys returns every key of the configuration file, in the order of the
// reference: a copy, which the caller may change.
func Keys() []Key {
	out := append([]Key(nil), keys...)
	for i := range out {
		out[i].OneOf = slices.Clone(out[i].OneOf)
	}
	return out
}

// keyOf returns the key at path, which must be in the table.
func keyOf(path string) *Key {
	for i := range keys {
		if keys[i].Path == path {
			return &keys[i]
		}
	}
	panic("config: no key " + path)
}

var (
	durationType = reflect.TypeFor[Duration]()
	sizeType     = reflect.TypeFor[ByteSize]()
	percentType  = reflect.TypeFor[Percent]()
)

// typeName names a field's type as the reference does.
func typeName(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return "duration"
	case t == sizeType:
		return "size"
	case t == percentType:
		return "percentage"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() == reflect.Int:
		return "integer"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "list of strings"
	}
	return t.String()
}

// fieldIndex finds the field of struct type t that holds the YAML key,
// looking into inline fields.
func fieldIndex(t reflect.Type, key string) ([]int, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || tag == "-":
		case opts == "inline":
			if sub, ok := fieldIndex(f.Type, key); ok {
				return append([]int{i}, sub...), true
			}
		case tag == key:
			return []int{i}, true
		}
	}
	return nil, false
}

// fieldType is the type of the field at the path segs below t.
func fieldType(t reflect.Type, segs []string) (reflect.Type, error) {
	for _, seg := range segs {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Map:
			if seg != "<name>" {
				return nil, fmt.Errorf("%s: a map's keys are written <name>", seg)
			}
			t = t.Elem()
		case reflect.Struct:
			idx, ok := fieldIndex(t, seg)
			if !ok {
				return nil, fmt.Errorf("%s has no key %s", t.Name(), seg)
			}
			t = t.FieldByIndex(idx).Type
		default:
			return nil, fmt.Errorf("%s: %s has no keys", seg, t)
		}
	}
	return t, nil
}

// setting is one place a key is set in a configuration: a key of the table
// with the names of its maps filled in.
type setting struct {
	segs []string      // the path, names filled in
	name string        // the innermost map key: a source's or an aggregate's name
	src  *Source       // the source it belongs to, or nil
	v    reflect.Value // the field
}

func (s setting) path() string { return strings.Join(s.segs, ".") }

// settings returns every place the key at pattern is set: once for a key
// outside maps, once per source or aggregate (or only the one called name,
// when name is not empty) for a key under one. Keys under a block that is
// absent (kafka.tls, sources.<name>.poll) have none.
func (c *Config) settings(pattern, name string) []setting {
	var out []setting
	var walk func(v reflect.Value, rest, segs []string, s setting)
	walk = func(v reflect.Value, rest, segs []string, s setting) {
		if len(rest) == 0 {
			s.segs, s.v = segs, v
			out = append(out, s)
			return
		}
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return
			}
			v = v.Elem()
		}
		seg := rest[0]
		switch v.Kind() {
		case reflect.Map:
			names := make([]string, 0, v.Len())
			for _, k := range v.MapKeys() {
				if n := k.String(); name == "" || n == name {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			for _, n := range names {
				e := v.MapIndex(reflect.ValueOf(n))
				s := s
				s.name = n
				if src, ok := e.Interface().(*Source); ok {
					s.src = src
				}
				walk(e, rest[1:], append(segs[:len(segs):len(segs)], n), s)
			}
		case reflect.Struct:
			idx, _ := fieldIndex(v.Type(), seg)
			walk(v.FieldByIndex(idx), rest[1:], append(segs[:len(segs):len(segs)], seg), s)
		}
	}
	walk(reflect.ValueOf(c), strings.Split(pattern, "."), nil, setting{})
	return out
}

// decodeText decodes text, written as in the file, into the field v.
func decodeText(v reflect.Value, text string) error {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: resolveTag(text), Value: text}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		return fmt.Errorf("%q: %w", text, err)
	}
	return nil
}

// number is the integer a field of a numeric type holds: a count, bytes,
// nanoseconds or hundredths of a percent.
func number(v reflect.Value) int64 {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	return v.Int()
}

// bound returns the value of a Min or Max text for a field of type t in
// the configuration c, and how an error shows it: the text itself, or the
// key it names with that key's value.
func (c *Config) bound(t reflect.Type, text string) (int64, string) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if strings.Contains(text, ".") {
		ref := c.settings(text, "")[0].v
		return number(ref), fmt.Sprintf("%s (%s)", text, formatValue(ref))
	}
	v := reflect.New(t).Elem()
	if err := decodeText(v, text); err != nil {
		panic("config: bound " + err.Error())
	}
	return number(v), text
}

// formatValue writes a field's value as the file would.
func formatValue(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	switch x := v.Interface().(type) {
	case Duration:
		return x.String()
	case Percent:
		return x.String()
	case ByteSize:
		for _, u := range []struct {
			suffix string
			mult   ByteSize
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if x >= u.mult && x%u.mult == 0 {
				return strconv.FormatInt(int64(x/u.mult), 10) + u.suffix
			}
		}
		return strconv.FormatInt(int64(x), 10)
	}
	return fmt.Sprint(v.Interface())
}

// applyDefaults fills every key left out (or written as 0 where that
// selects the default) with its default; written reports whether the
// file sets the key at a path.
func (c *Config) applyDefaults(lookup func(string) (string, bool), written func(segs []string) bool) {
	for name, s := range c.Sources {
		if s != nil {
			s.Name = name
			s.Retention.written = s.Retention != (SourceRetention{})
		}
	}
	for name, a := range c.Aggregates {
		if a != nil {
			a.Name = name
		}
	}
	c.SchemaRegistry.timeoutSet = c.SchemaRegistry.Timeout != 0
	for i := range keys {
		k := &keys[i]
		if k.Default == "" && k.Env == "" {
			continue
		}
		for _, s := range c.settings(k.Path, "") {
			c.fill(k, s, lookup, written)
		}
	}
	for _, s := range c.Sources {
		if s != nil {
			s.Decode = DecodeLimits{MaxBytes: int64(c.Ingest.DecodeMaxBytes), Expansion: int64(c.Ingest.DecodeMaxExpansion)}
		}
	}
}

// fill gives the setting s of key k its default, if it has none of its own.
func (c *Config) fill(k *Key, s setting, lookup func(string) (string, bool), written func(segs []string) bool) {
	if !s.v.IsZero() || (k.KeepZero || s.v.Kind() == reflect.Bool) && written(s.segs) {
		return
	}
	if k.Env != "" {
		if v, ok := lookup(k.Env); ok {
			s.v.SetString(v)
		}
		return
	}
	def := k.Default
	if k.defaultIn != nil {
		def = k.defaultIn(c, s.src, def)
	}
	if def == "" {
		return
	}
	if err := decodeText(s.v, strings.ReplaceAll(def, "<name>", s.name)); err != nil {
		panic("config: the default of " + k.Path + ": " + err.Error())
	}
	if strings.Contains(k.Max, ".") {
		if max, _ := c.bound(s.v.Type(), k.Max); number(s.v) > max {
			s.v.SetInt(max)
		}
	}
}

// check reports the value of the key at pattern, in the source or
// aggregate called name, when it is not one of the key's values or lies
// outside its bounds. It returns whether the value is good.
func (c *Config) check(ix *index, pattern, name string) bool {
	k := keyOf(pattern)
	ok := true
	for _, s := range c.settings(pattern, name) {
		path := s.path()
		if len(k.OneOf) > 0 && !oneOf(ix, path, s.v.String(), k.OneOf...) {
			ok = false
			continue
		}
		if k.Min == "" && k.Max == "" || s.v.Kind() == reflect.Pointer && s.v.IsNil() {
			continue
		}
		v := number(s.v)
		if k.Zero != "" && v == 0 {
			continue
		}
		var must string
		min, minText := c.bound(s.v.Type(), k.Min)
		switch {
		case k.Max == "" && min == 0:
			must = "must not be negative"
			if v < 0 {
				ix.add(path, "%s%s, got %s", must, k.Why, ix.text(path, s.v))
				ok = false
			}
			continue
		case k.Max == "":
			if v >= min {
				continue
			}
			must = "at least " + minText
		default:
			max, maxText := c.bound(s.v.Type(), k.Max)
			if v >= min && v <= max {
				continue
			}
			must = "between " + minText + " and " + maxText
		}
		if k.Zero != "" {
			must = "0 (" + k.Zero + ") or " + must
		}
		ix.add(path, "must be %s%s, got %s", must, k.Why, ix.text(path, s.v))
		ok = false
	}
	return ok
}
