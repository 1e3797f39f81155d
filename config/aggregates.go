package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Aggregate is an event-date aggregate: a user query over one partition of
// a source's raw events, kept up to date by the reconciler.
type Aggregate struct {
	Source string `yaml:"source"`
	// Table is the target table, "name" (schema public) or "schema.name";
	// created from the query's columns when missing.
	Table     string             `yaml:"table"`
	Partition AggregatePartition `yaml:"partition"`
	// LatenessHorizon bounds how long after its end a partition may still
	// change, at most a year. 0 is allowed: every event ingested after its
	// partition's end is beyond the horizon.
	LatenessHorizon Duration `yaml:"lateness_horizon"`
	// BeyondHorizon is what happens to events later than the horizon:
	// correction, arrival or rebuild.
	BeyondHorizon string `yaml:"beyond_horizon"`
	// SQL is a SELECT over {{events}} producing the rows of the partition
	// {{partition}}. Besides {{events}} it may read reference tables of
	// the warehouse, never the schema tidemark (aggregate.Prepare refuses
	// that).
	SQL string `yaml:"sql"`
	// VerifyEvery runs a verification of every partition (as `tidemark
	// verify`) inside `tidemark run` at this interval; 0 runs none.
	VerifyEvery Duration `yaml:"verify_every"`
	// RefreshEvery runs a full refresh (as `tidemark refresh --full`)
	// inside `tidemark run` at this interval; 0 runs none.
	RefreshEvery Duration `yaml:"refresh_every"`

	// Name is the key under aggregates.
	Name string `yaml:"-"`
}

// AggregatePartition says how an aggregate is partitioned by event time.
type AggregatePartition struct {
	By       string `yaml:"by"`        // hour, day or month
	Column   string `yaml:"column"`    // the target column holding the partition key
	TimeZone string `yaml:"time_zone"` // IANA name
}

// Location returns the partition time zone.
func (p AggregatePartition) Location() *time.Location {
	loc, err := time.LoadLocation(p.TimeZone)
	if err != nil {
		return time.UTC
	}
	return loc
}

// Reconcile tunes the reconciler.
type Reconcile struct {
	Every               Duration `yaml:"every"`
	MaxPartitionsPerRun Int      `yaml:"max_partitions_per_run"`
	RunTimeout          Duration `yaml:"run_timeout"`
}

// TableSource is a raw table that another tool writes. The reconciler
// reads it in timestamp mode: each run reads the rows whose ingestion time
// lies in (watermark - lookback, now() - safety_lag] and advances the
// watermark to the newest ingestion time it read.
type TableSource struct {
	Name       string   `yaml:"name"`        // "schema.table" or "table"
	Key        []string `yaml:"key"`         // columns identifying a row
	EventTime  string   `yaml:"event_time"`  // timestamptz column
	IngestedAt string   `yaml:"ingested_at"` // timestamptz column set when the row is written
	Lookback   Duration `yaml:"lookback"`    // longest expected commit delay
	SafetyLag  Duration `yaml:"safety_lag"`
}

// Beyond-horizon policies.
const (
	PolicyCorrection = "correction"
	PolicyArrival    = "arrival"
	PolicyRebuild    = "rebuild"

	PartitionHour = "hour"
)

var (
	identRe     = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	aggregateRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// ValidTableName checks "name" or "schema.name" with lower-case SQL
// identifiers.
func ValidTableName(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return false
		}
	}
	return true
}

// reservedSchemas are the schemas tidemark writes itself: the raw tables'
// (raw.Schema, which a test keeps in step) and its state's.
var reservedSchemas = []string{"raw", "tidemark"}

// ReservedSchema reports whether schema belongs to tidemark, so that no
// mirror or aggregate may be written there.
func ReservedSchema(schema string) bool { return slices.Contains(reservedSchemas, schema) }

// SplitTable returns the schema (default public) and name of a table.
func SplitTable(s string) (schema, name string) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "public", s
}

func (c *Config) validateTableSource(ix *index, p string, s *Source) {
	t := s.Table
	if !ValidTableName(t.Name) {
		ix.add(p+".table.name", "must be a table name such as events or partner.events (lower-case identifiers), got %q", t.Name)
	}
	if len(t.Key) == 0 {
		ix.add(p+".table.key", "at least one key column is required (it identifies a row)")
	}
	for i, k := range t.Key {
		if !identRe.MatchString(k) {
			ix.add(fmt.Sprintf("%s.table.key[%d]", p, i), "%q is not a column name", k)
		}
	}
	for key, col := range map[string]string{"event_time": t.EventTime, "ingested_at": t.IngestedAt} {
		if !identRe.MatchString(col) {
			ix.add(p+".table."+key, "must name a timestamptz column, got %q", col)
		}
	}
	c.check(ix, "sources.<name>.table.lookback", s.Name)
	c.check(ix, "sources.<name>.table.safety_lag", s.Name)
	if s.EventID != "" || s.EventTime != "" {
		ix.add(p, "event_id and event_time pointers apply to Kafka sources; a table source names columns under table")
	}
	c.check(ix, "sources.<name>.watermark.out_of_orderness", s.Name)
}

// AggregateNames returns the aggregate names in sorted order.
func (c *Config) AggregateNames() []string {
	names := make([]string, 0, len(c.Aggregates))
	for n := range c.Aggregates {
		names = append(names, n)
	}
	sortStrings(names)
	return names
}

func (c *Config) validateAggregates(ix *index) {
	for _, key := range []string{"every", "max_partitions_per_run", "run_timeout"} {
		c.check(ix, "reconcile."+key, "")
	}
	tables := map[string]string{}
	for _, name := range c.AggregateNames() {
		a := c.Aggregates[name]
		p := "aggregates." + name
		if !aggregateRe.MatchString(name) {
			ix.add(p, "aggregate names must match %s", aggregateRe)
		}
		if a == nil {
			ix.add(p, "is empty")
			continue
		}
		if a.Source == "" {
			ix.add(p+".source", "is required: the name of a source")
		} else if c.Sources[a.Source] == nil {
			ix.add(p+".source", "no source is named %q", a.Source)
		}
		switch {
		case a.Table == "":
			ix.add(p+".table", "is required: the target table")
		case !ValidTableName(a.Table):
			ix.add(p+".table", "must be a table name such as daily_sales or reports.daily_sales (lower-case identifiers), got %q", a.Table)
		default:
			schema, tname := SplitTable(a.Table)
			full := schema + "." + tname
			if other := tables[full]; other != "" {
				ix.add(p+".table", "table %s is already the target of aggregate %s", full, other)
			}
			tables[full] = name
			if ReservedSchema(schema) {
				ix.add(p+".table", "schema %s belongs to tidemark; choose another", schema)
			}
			if strings.HasSuffix(tname, "__shadow") {
				// Another aggregate's shadow table would be this one.
				ix.add(p+".table", "names ending in __shadow are kept for the shadow tables of `tidemark backfill --shadow`; choose another")
			}
		}
		c.check(ix, "aggregates.<name>.partition.by", name)
		if !identRe.MatchString(a.Partition.Column) {
			ix.add(p+".partition.column", "must name the target column holding the partition key, got %q", a.Partition.Column)
		}
		if _, err := time.LoadLocation(a.Partition.TimeZone); err != nil || a.Partition.TimeZone == "Local" {
			ix.add(p+".partition.time_zone", "%q is not an IANA time zone such as UTC or America/New_York", a.Partition.TimeZone)
		}
		for _, key := range []string{"lateness_horizon", "beyond_horizon", "verify_every", "refresh_every"} {
			c.check(ix, "aggregates.<name>."+key, name)
		}
		sql := strings.TrimSpace(a.SQL)
		switch {
		case sql == "":
			ix.add(p+".sql", "is required: a SELECT over {{events}}")
		case !strings.Contains(sql, "{{events}}"):
			ix.add(p+".sql", "must read {{events}}, the partition's raw rows")
		case strings.HasSuffix(sql, ";"):
			ix.add(p+".sql", "must be one SELECT without a trailing semicolon")
		}
		for _, m := range placeholderRe.FindAllString(sql, -1) {
			if m != "{{events}}" && m != "{{partition}}" {
				ix.add(p+".sql", "unknown placeholder %s (use {{events}} and {{partition}})", m)
			}
		}
	}
}

var placeholderRe = regexp.MustCompile(`\{\{[^}]*\}\}`)
