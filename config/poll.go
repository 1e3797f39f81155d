package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// PollSource is a source table loaded by timestamp watermark: each run
// reads the rows whose updated_at lies in (watermark - lookback, upper],
// where upper is now() - safety_lag on the source's clock, merges them into
// the mirror table and advances the watermark to the newest updated_at it
// read.
type PollSource struct {
	DSN string `yaml:"dsn"` // source database
	// DSNFile names a file holding the DSN, instead of dsn.
	DSNFile string   `yaml:"dsn_file"`
	Table   string   `yaml:"table"` // "schema.table" or "table" (schema public)
	Key     []string `yaml:"key"`   // columns of a unique key of the source table
	// UpdatedAt names the column every write sets: timestamptz, or
	// timestamp without time zone together with TimeZone.
	UpdatedAt string `yaml:"updated_at"`
	// TimeZone is the IANA zone in which a timestamp-without-time-zone
	// updated_at column is written. Refused for timestamptz columns.
	TimeZone string `yaml:"time_zone"`
	// Lookback re-reads this much before the watermark on every run; set
	// it above the longest write transaction of the source.
	Lookback Duration `yaml:"lookback"`
	// SafetyLag keeps the window's upper bound this far behind the
	// source's clock.
	SafetyLag Duration `yaml:"safety_lag"`
	// Every is the interval between runs inside `tidemark run`.
	Every Duration `yaml:"every"`
	// ChunkRows is how many rows are fetched from the source at a time.
	ChunkRows Int `yaml:"chunk_rows"`
	// MaxRowsPerRun bounds one run's transaction; a run that reaches it
	// stops after the last row sharing the current updated_at, and the next
	// run follows at once.
	MaxRowsPerRun Int `yaml:"max_rows_per_run"`
	// SoftDelete optionally names the source's soft-delete column: a
	// boolean (true means deleted) or a timestamp (set means deleted). Such
	// rows are merged like any update and recorded with op "delete".
	SoftDelete string `yaml:"soft_delete"`
}

// Location returns the zone of a timestamp-without-time-zone updated_at
// column, or nil when none is configured.
func (p *PollSource) Location() *time.Location {
	if p.TimeZone == "" {
		return nil
	}
	loc, err := time.LoadLocation(p.TimeZone)
	if err != nil {
		return nil
	}
	return loc
}

// Mirror is the warehouse copy of a poll or CDC source table: the source's
// columns with its key as primary key, plus the time each row was loaded
// and, for soft deletes, when it was found deleted.
type Mirror struct {
	// Table is "name" (schema public) or "schema.name"; created from the
	// source's columns when missing.
	Table string `yaml:"table"`
	// Schema holds the mirrors of a CDC source, named like the source
	// tables (CDC sources only).
	Schema string `yaml:"schema"`
	// Deletes is what happens to a row found deleted at the source:
	// soft sets DeletedColumn and keeps the row; hard removes it.
	Deletes string `yaml:"deletes"`
	// DeletedColumn is the mirror column set when a row is found deleted.
	// It must not be a column of the source.
	DeletedColumn string `yaml:"deleted_column"`
	// LoadedColumn is the mirror column holding when a row was last
	// written. It must not be a column of the source.
	LoadedColumn string `yaml:"loaded_column"`
	// PositionColumn is the mirror column holding the source position
	// of the change that last wrote each row (Debezium sources only).
	PositionColumn string `yaml:"position_column"`
	// SourceDSN and SourceTable name the PostgreSQL table a Debezium
	// source's connector reads, when it is reachable: `tidemark keys
	// --dry-run` compares the mirror's keys with it. SourceDSNFile holds
	// the DSN instead of SourceDSN.
	SourceDSN     string `yaml:"source_dsn"`
	SourceDSNFile string `yaml:"source_dsn_file"`
	SourceTable   string `yaml:"source_table"`
	// KeyReconcileEvery schedules key reconciliation (hard-delete
	// detection) inside `tidemark run`; 0 leaves it to `tidemark keys`.
	KeyReconcileEvery Duration `yaml:"key_reconcile_every"`
	// KeyReconcileMaxDelete is the largest share of the mirror's live rows
	// that one key reconciliation run may flag or remove (rounded up to a
	// whole row). A run that finds more rows missing at the source applies
	// nothing and is recorded as refused, until `tidemark keys --force`
	// applies them: a source table emptied by mistake is not mirrored as
	// emptied. 100% turns the limit off, 0% refuses every delete. Poll
	// sources only: nil for the others.
	KeyReconcileMaxDelete *Percent `yaml:"key_reconcile_max_delete"`
}

// DefaultKeyReconcileMaxDelete is the default of
// mirror.key_reconcile_max_delete, 10%, as the table of keys gives it.
const DefaultKeyReconcileMaxDelete Percent = 10 * PercentUnit

// Percent is a share written as a percentage with at most two decimals:
// "10%", "2.5%", "0.25%", "100%". It counts hundredths of a percent
// (PercentUnit is 1%).
type Percent int64

// PercentUnit is one percent.
const PercentUnit Percent = 100

var percentRe = regexp.MustCompile(`^([0-9]{1,9})(?:\.([0-9]{1,2}))?%$`)

// ParsePercent parses a percentage such as 10%, 2.5% or 100%. It checks
// the form only; a configuration key bounds the value.
func ParsePercent(text string) (Percent, error) {
	m := percentRe.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return 0, fmt.Errorf("invalid percentage %q (use e.g. 10%%, 2.5%% or 100%%, with at most two decimals)", text)
	}
	whole, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid percentage %q: %w", text, err)
	}
	frac := int64(0)
	if m[2] != "" {
		frac, _ = strconv.ParseInt((m[2] + "0")[:2], 10, 64)
	}
	return Percent(whole*100 + frac), nil
}

// String formats the percentage: "10%", "2.5%", "0.25%".
func (p Percent) String() string {
	s := strconv.FormatInt(int64(p/PercentUnit), 10)
	if frac := int64(p % PercentUnit); frac != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%02d", frac), "0")
	}
	return s + "%"
}

// Of returns the share p of n rounded up to a whole number, so that any
// share above 0% of a positive n is at least 1.
func (p Percent) Of(n int64) int64 {
	if n <= 0 || p <= 0 {
		return 0
	}
	// Whole multiples of 100% apart, so that n * p cannot overflow.
	q, r := n/int64(100*PercentUnit), n%int64(100*PercentUnit)
	return q*int64(p) + (r*int64(p)+int64(100*PercentUnit)-1)/int64(100*PercentUnit)
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (p *Percent) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return located(n, "expected a percentage such as 10%%")
	}
	v, err := ParsePercent(n.Value)
	if err != nil {
		return located(n, "%v", err)
	}
	*p = v
	return nil
}

// Mirror delete modes.
const (
	DeletesSoft = "soft"
	DeletesHard = "hard"
)

func (c *Config) validatePollSource(ix *index, p string, s *Source) {
	t := s.Poll
	if t.DSN == "" {
		ix.add(p+".poll.dsn", "is required: the source database's connection string")
	}
	if !ValidTableName(t.Table) {
		ix.add(p+".poll.table", "must be a table name such as customers or public.customers (lower-case identifiers), got %q", t.Table)
	}
	if len(t.Key) == 0 {
		ix.add(p+".poll.key", "at least one key column is required (a unique key of the source table)")
	}
	seen := map[string]bool{}
	for i, k := range t.Key {
		kp := fmt.Sprintf("%s.poll.key[%d]", p, i)
		switch {
		case !identRe.MatchString(k):
			ix.add(kp, "%q is not a column name", k)
		case seen[k]:
			ix.add(kp, "column %s is listed twice", k)
		}
		seen[k] = true
	}
	if !identRe.MatchString(t.UpdatedAt) {
		ix.add(p+".poll.updated_at", "must name the source's update-time column, got %q", t.UpdatedAt)
	} else if seen[t.UpdatedAt] {
		ix.add(p+".poll.updated_at", "must not be a key column")
	}
	if t.TimeZone != "" {
		if _, err := time.LoadLocation(t.TimeZone); err != nil || t.TimeZone == "Local" {
			ix.add(p+".poll.time_zone", "%q is not an IANA time zone such as UTC or Europe/Berlin", t.TimeZone)
		}
	}
	for _, key := range []string{"lookback", "safety_lag", "every", "chunk_rows", "max_rows_per_run"} {
		c.check(ix, "sources.<name>.poll."+key, s.Name)
	}
	if t.SoftDelete != "" && !identRe.MatchString(t.SoftDelete) {
		ix.add(p+".poll.soft_delete", "must name a boolean or timestamp column, got %q", t.SoftDelete)
	}
	if s.EventID != "" || s.EventTime != "" {
		ix.add(p, "event_id and event_time pointers apply to Kafka sources; a poll source's event time is its updated_at")
	}
	if s.Mirror == nil {
		ix.add(p+".mirror", "is required for a poll source: mirror: {table: NAME}")
	}
	c.check(ix, "sources.<name>.watermark.out_of_orderness", s.Name)
}

// validateCDCMirror checks the mirror keys of a CDC source; the mirror
// tables themselves come from cdc.tables.
func (c *Config) validateCDCMirror(ix *index, p string, s *Source, tables map[string]string) {
	m := s.Mirror
	c.check(ix, "sources.<name>.mirror.deletes", s.Name)
	if !identRe.MatchString(m.DeletedColumn) {
		ix.add(p+".mirror.deleted_column", "%q is not a column name", m.DeletedColumn)
	}
	if !identRe.MatchString(m.LoadedColumn) || m.LoadedColumn == m.DeletedColumn {
		ix.add(p+".mirror.loaded_column", "must be a column name other than mirror.deleted_column")
	}
	if m.KeyReconcileEvery != 0 {
		ix.add(p+".mirror.key_reconcile_every", "applies to poll sources: a CDC source's deletes arrive through its slot; "+
			"check its mirrors for drift with `tidemark keys --source %s --dry-run`", s.Name)
	}
	if m.KeyReconcileMaxDelete != nil {
		ix.add(p+".mirror.key_reconcile_max_delete", "applies to poll sources: key reconciliation never changes the mirrors of a CDC source")
	}
	if m.Table != "" && !ValidTableName(m.Table) {
		ix.add(p+".mirror.table", "must be a table name such as dw_customers, got %q", m.Table)
		return
	}
	for _, target := range s.MirrorTables() {
		schema, name := SplitTable(target)
		if other := tables[schema+"."+name]; other != "" {
			ix.add(p+".mirror", "table %s.%s is already used by %s", schema, name, other)
		}
		tables[schema+"."+name] = p
	}
}

func (c *Config) validateMirror(ix *index, p string, s *Source, tables map[string]string) {
	m := s.Mirror
	switch {
	case m.Table == "":
		ix.add(p+".mirror.table", "is required: the warehouse table mirroring the source")
	case !ValidTableName(m.Table):
		ix.add(p+".mirror.table", "must be a table name such as dw_customers or mirror.customers (lower-case identifiers), got %q", m.Table)
	default:
		schema, name := SplitTable(m.Table)
		full := schema + "." + name
		if ReservedSchema(schema) {
			ix.add(p+".mirror.table", "schema %s belongs to tidemark; choose another", schema)
		} else if other := tables[full]; other != "" {
			ix.add(p+".mirror.table", "table %s is already used by %s", full, other)
		}
		tables[full] = p
	}
	c.check(ix, "sources.<name>.mirror.deletes", s.Name)
	if !identRe.MatchString(m.DeletedColumn) {
		ix.add(p+".mirror.deleted_column", "%q is not a column name", m.DeletedColumn)
	}
	if !identRe.MatchString(m.LoadedColumn) {
		ix.add(p+".mirror.loaded_column", "%q is not a column name", m.LoadedColumn)
	} else if m.LoadedColumn == m.DeletedColumn {
		ix.add(p+".mirror.loaded_column", "must differ from mirror.deleted_column")
	}
	c.check(ix, "sources.<name>.mirror.key_reconcile_every", s.Name)
	c.check(ix, "sources.<name>.mirror.key_reconcile_max_delete", s.Name)
}
