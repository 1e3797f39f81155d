// Package config reads tidemark's one YAML configuration file.
//
// Values may refer to the environment as ${NAME} or ${NAME:-default}; "$$"
// is a literal dollar sign. Expansion happens per value after parsing, so an
// environment value never changes the structure of the file. Every problem
// found is reported with the file, line and dotted key it concerns, all of
// them at once as Errors, in two rounds: syntax, unset variables, unknown
// keys and wrong types first; once those are fixed, invalid values and
// missing required keys.
//
// Every key is declared once, in the table of keys.go (see Keys), with its
// default and the values it accepts: Parse fills the defaults from it and
// the validation checks its bounds, and docs/configuration.md, which
// documents every key, shows the same defaults and bounds (its test
// compares the two).
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"
)

// EnvDatabaseURL is read when warehouse.dsn is not set.
const EnvDatabaseURL = "TIDEMARK_DATABASE_URL"

// Config is the whole configuration.
type Config struct {
	Warehouse Warehouse `yaml:"warehouse"`
	HTTP      HTTP      `yaml:"http"`
	Log       Log       `yaml:"log"`
	Kafka     Kafka     `yaml:"kafka"`
	// SchemaRegistry is where the sources of a registry format read
	// their schemas.
	SchemaRegistry SchemaRegistry     `yaml:"schema_registry"`
	Ingest         Ingest             `yaml:"ingest"`
	Sources        map[string]*Source `yaml:"sources"`
	// Aggregates are event-date aggregates kept by the reconciler.
	Aggregates map[string]*Aggregate `yaml:"aggregates"`
	Reconcile  Reconcile             `yaml:"reconcile"`
	// Retention bounds tidemark's state tables; per-source raw and
	// dead-letter retention is under each source.
	Retention Retention `yaml:"retention"`

	// File is the path the configuration was read from.
	File string `yaml:"-"`
}

// Warehouse is the PostgreSQL database tidemark writes to.
type Warehouse struct {
	DSN string `yaml:"dsn"`
	// DSNFile names a file holding the DSN, instead of dsn.
	DSNFile string `yaml:"dsn_file"`
	// Migrate applies the migrations when `tidemark run` starts.
	Migrate  bool `yaml:"migrate"`
	MaxConns Int  `yaml:"max_conns"` // pool size
	// Distribute makes, on a warehouse with the citus extension, the raw
	// tables of Kafka, Debezium and CDC sources and the mirrors of CDC
	// and Debezium sources distributed tables, created so.
	Distribute bool `yaml:"distribute"`
	// WarehouseLimits are the session settings and client deadlines.
	WarehouseLimits `yaml:",inline"`
}

// HTTP is the operator endpoint: the status page /, /metrics, /healthz,
// /readyz and /status.
type HTTP struct {
	Listen string `yaml:"listen"` // host:port; "off" disables
	// Token, when set (or read from TokenFile), is the bearer token that
	// the pages for people (/ and /status) require; the probes and
	// /metrics stay open. It is a b64token (RFC 6750) of at least 16
	// characters.
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
}

// Enabled reports whether the HTTP server runs.
func (h HTTP) Enabled() bool { return h.Listen != "off" }

func (h HTTP) tokenKey() string {
	if h.TokenFile != "" {
		return "http.token_file"
	}
	return "http.token"
}

// badTokenChar returns the position (counting characters from 1) of the
// first character of t that a bearer token cannot hold there, or 0 when t
// is a b64token of RFC 6750 (token68 of RFC 9110): one or more letters,
// digits and - . _ ~ + /, then any number of =. That is the text a token
// can be in an Authorization header without quoting, and covers base64,
// base64url and hexadecimal text.
func badTokenChar(t string) int {
	n, pad := 0, false
	for _, r := range t {
		n++
		switch {
		case r == '=' && n > 1:
			pad = true
		case pad || !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~+/", r)):
			return n
		}
	}
	return 0
}

// validateToken checks t, the token of http.token or http.token_file. The
// messages never show it.
func (h HTTP) validateToken(ix *index, t string) {
	key := h.tokenKey()
	trimmed := strings.TrimSpace(t)
	switch {
	case trimmed == "":
		ix.add(key, "is blank")
	case trimmed != t && key == "http.token_file":
		ix.add(key, "the token must not begin or end with white space (one trailing newline of the file is dropped, nothing else is)")
	case trimmed != t:
		ix.add(key, "must not begin or end with white space")
	case badTokenChar(t) > 0:
		ix.add(key, "must be a bearer token as RFC 6750 defines it (b64token): letters, digits and - . _ ~ + /, "+
			"then optionally = padding; character %d is not allowed there", badTokenChar(t))
	case len(t) < 16:
		ix.add(key, "must be at least 16 characters, got %d", len(t))
	}
}

// Log configures the process log.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

// Ingest tunes how records are batched into warehouse transactions, and
// bounds what one record may decode to.
type Ingest struct {
	// MemoryMaxBytes bounds the Kafka records held in memory: fetched,
	// decoded, batched and being written. The defaults of
	// kafka.fetch_max_bytes and batch_max_bytes are a third of it each.
	MemoryMaxBytes ByteSize `yaml:"memory_max_bytes"`
	BatchMaxRows   Int      `yaml:"batch_max_rows"`
	BatchMaxBytes  ByteSize `yaml:"batch_max_bytes"`
	BatchMaxAge    Duration `yaml:"batch_max_age"`
	// DecodeMaxBytes caps the JSON that one record of a registry format,
	// or one Debezium change, decodes to.
	DecodeMaxBytes ByteSize `yaml:"decode_max_bytes"`
	// DecodeMaxExpansion bounds that JSON to this many times the
	// record's size, plus DecodeSlack.
	DecodeMaxExpansion Int `yaml:"decode_max_expansion"`
}

// DecodeSlack is what any record may decode to beyond
// ingest.decode_max_expansion times its size: room for a small record
// whose schema adds many field names.
const DecodeSlack = 64 << 10

// DefaultMemoryMaxBytes is the default of ingest.memory_max_bytes: a
// third for the fetch the Kafka client holds, a third for the batch being
// written and a third for the next one, decoded while it is written. At
// 6 MiB a batch of records of a few hundred bytes holds about ten
// thousand rows, which keeps a transaction's fixed cost small; and with
// the runtime's memory limit that follows from it (cmd/tidemark), the
// process stays under 64 MiB resident (docs/benchmarks.md).
const DefaultMemoryMaxBytes ByteSize = 18 << 20

// third is a third of the records' memory budget m (its default when 0),
// in whole KiB.
func third(m ByteSize) ByteSize {
	if m <= 0 {
		m = DefaultMemoryMaxBytes
	}
	return max(m/3/1024*1024, 1024)
}

// memoryDefault is the default of ingest.memory_max_bytes in c: the
// constant, or more when kafka.fetch_max_bytes and ingest.batch_max_bytes
// (filled before it or written) need more.
func memoryDefault(c *Config) ByteSize {
	b := c.Ingest.BatchMaxBytes
	if b <= 0 {
		b = third(0)
	}
	return max(DefaultMemoryMaxBytes, c.Kafka.FetchMaxBytes+2*b)
}

// batchDefault is the default of ingest.batch_max_bytes in c: a third of
// ingest.memory_max_bytes, less if the fetch takes more than its third.
func batchDefault(c *Config) ByteSize {
	return max(min(third(c.Ingest.MemoryMaxBytes), (c.Ingest.MemoryMaxBytes-c.Kafka.FetchMaxBytes)/2/1024*1024), 1024)
}

// MemoryBudget is what the sources of c hold in memory at most by their
// budgets: ingest.memory_max_bytes when a source reads Kafka, and twice
// the cdc.max_buffer_bytes of each CDC source (a transaction buffered and
// one being applied: a reader applying one of a million rows holds about
// 1.8 times its buffer, docs/benchmarks.md).
func (c *Config) MemoryBudget() int64 {
	var n int64
	kafka := false
	for _, s := range c.Sources {
		switch {
		case s.CDC != nil:
			n += 2 * int64(s.CDC.MaxBufferBytes)
		case s.Kind().Kafka():
			kafka = true
		}
	}
	if kafka {
		n += int64(c.Ingest.MemoryMaxBytes)
	}
	return n
}

// The defaults of ingest.decode_max_bytes and
// ingest.decode_max_expansion.
const (
	DefaultDecodeMaxBytes     ByteSize = 64 << 20
	DefaultDecodeMaxExpansion          = 64
)

// DecodeLimits bound the decoding of one record of a source: the ingest
// settings, as every source carries them.
type DecodeLimits struct {
	// MaxBytes is ingest.decode_max_bytes.
	MaxBytes int64
	// Expansion is ingest.decode_max_expansion.
	Expansion int64
}

// Source is one stream of events loaded into raw.<name>.
type Source struct {
	Kafka *KafkaSource `yaml:"kafka"`
	// Table is a raw table written by another tool, read in timestamp mode.
	Table *TableSource `yaml:"table"`
	// Poll is a source table loaded by updated_at watermark into Mirror.
	Poll *PollSource `yaml:"poll"`
	// CDC is a set of tables of another PostgreSQL database read through
	// logical replication into mirrors.
	CDC *CDCSource `yaml:"cdc"`
	// Mirror is the warehouse copy of a poll or CDC source's tables, or
	// of the table a Debezium topic carries.
	Mirror *Mirror `yaml:"mirror"`
	// Format is how a Kafka source's record values are encoded: one of
	// the Format constants (Debezium change events: FormatDebezium).
	Format string `yaml:"format"`

	EventID           string   `yaml:"event_id"`            // JSON pointer
	EventIDFallback   string   `yaml:"event_id_fallback"`   // "" or coordinates
	EventTime         string   `yaml:"event_time"`          // JSON pointer
	EventTimeFormat   string   `yaml:"event_time_format"`   // auto, rfc3339, unix_seconds, unix_millis
	EventTimeFallback string   `yaml:"event_time_fallback"` // "" or record_timestamp
	MaxAge            Duration `yaml:"max_age"`
	MaxFutureSkew     Duration `yaml:"max_future_skew"`
	RawPartition      string   `yaml:"raw_partition"` // day or month

	Watermark Watermark `yaml:"watermark"`
	// Retention says how long the source's raw partitions and dead
	// letters are kept.
	Retention SourceRetention `yaml:"retention"`
	// Dedupe drops events whose id was loaded before (Kafka sources).
	Dedupe *Dedupe `yaml:"dedupe"`

	// Name is the key under sources.
	Name string `yaml:"-"`
	// Decode bounds the decoding of one record: the ingest block's
	// decode_max_bytes and decode_max_expansion, set at load.
	Decode DecodeLimits `yaml:"-"`
}

// KafkaSource is a source fed by Kafka topics.
type KafkaSource struct {
	Topics []string `yaml:"topics"`
}

// Dedupe says which events of a Kafka source are duplicates beyond the
// raw table's key (event_id, event_time).
type Dedupe struct {
	// By is DedupeNone or DedupeEventID: an event whose id was loaded
	// within Window is dropped whatever its time.
	By string `yaml:"by"`
	// Window is how long a loaded id drops later events with that id.
	Window Duration `yaml:"window"`
}

// Dedupe values.
const (
	DedupeNone    = "none"
	DedupeEventID = "event_id"
)

// MaxDedupeWindow is the largest dedupe.window (366d in the table of
// keys): retention keeps the ids of a source that no configuration it
// reads dedupes for as long, as another instance may.
const MaxDedupeWindow = 366 * 24 * time.Hour

// DedupeWindow is how long an event id loaded by the source drops later
// events with that id; zero when the source does not dedupe by id.
func (s *Source) DedupeWindow() time.Duration {
	if s.Dedupe == nil || s.Dedupe.By != DedupeEventID {
		return 0
	}
	return s.Dedupe.Window.Duration()
}

// Watermark tunes the event-time watermark of a source.
type Watermark struct {
	OutOfOrderness Duration `yaml:"out_of_orderness"`
	IdleTimeout    Duration `yaml:"idle_timeout"`
}

// Fallback and format values.
const (
	FallbackCoordinates     = "coordinates"
	FallbackRecordTimestamp = "record_timestamp"

	TimeAuto        = "auto"
	TimeRFC3339     = "rfc3339"
	TimeUnixSeconds = "unix_seconds"
	TimeUnixMillis  = "unix_millis"

	PartitionDay   = "day"
	PartitionMonth = "month"
)

// Load reads, expands, decodes, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse is Load for bytes already read; lookup resolves environment names.
func Parse(file string, data []byte, lookup func(string) (string, bool)) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		ix := newIndex(file, nil)
		ix.decodeError(err)
		return nil, ix.sorted()
	}
	ix := newIndex(file, &root)
	if root.Kind == 0 || len(root.Content) == 0 {
		ix.add("", "the file is empty")
		return nil, ix.sorted()
	}
	expandNode(ix, "", root.Content[0], lookup)
	expanded := len(ix.problems) == 0
	unknownKeys(ix, data)
	cfg := &Config{File: file}
	if expanded {
		// Values of unset variables would only add confusing type errors.
		if err := root.Decode(cfg); err != nil {
			ix.decodeError(err)
		}
	}
	if len(ix.problems) > 0 {
		return nil, ix.sorted()
	}
	cfg.readSecretFiles(ix)
	if len(ix.problems) > 0 {
		return nil, ix.sorted()
	}
	cfg.applyDefaults(lookup, writtenIn(&root))
	cfg.validate(ix)
	if len(ix.problems) > 0 {
		return nil, ix.sorted()
	}
	return cfg, nil
}

var envRe = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// expandNode replaces ${NAME} references in scalar values, recording an
// error for each reference to an unset variable without a default.
func expandNode(ix *index, path string, n *yaml.Node, lookup func(string) (string, bool)) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			expandNode(ix, join(path, n.Content[i].Value), n.Content[i+1], lookup)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			expandNode(ix, fmt.Sprintf("%s[%d]", path, i), item, lookup)
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "$") {
			return
		}
		n.Value = envRe.ReplaceAllStringFunc(n.Value, func(m string) string {
			if m == "$$" {
				return "$"
			}
			sub := envRe.FindStringSubmatch(m)
			v, set := lookup(sub[1])
			switch {
			case sub[2] != "" && v == "":
				return sub[3] // ${NAME:-default}: unset or empty
			case set:
				return v
			}
			// A scalar that is the whole document has no key: name its line.
			line := ix.line(path)
			if line == 0 {
				line = n.Line
			}
			ix.problems = append(ix.problems, Error{File: ix.file, Line: line, Key: path,
				Msg: fmt.Sprintf("environment variable %s is not set", sub[1])})
			return ""
		})
		if n.Style == 0 {
			// A plain scalar is typed by its text, so "${PORT}" can fill an
			// integer; but an expanded "null" or "~" stays text.
			n.Tag = resolveTag(n.Value)
		}
	}
}

var (
	intRe   = regexp.MustCompile(`^[-+]?[0-9]+$`)
	floatRe = regexp.MustCompile(`^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$`)
)

// resolveTag types an expanded plain scalar: integers, numbers and
// booleans keep their type, everything else is a string.
func resolveTag(v string) string {
	switch {
	case intRe.MatchString(v):
		return "!!int"
	case floatRe.MatchString(v):
		return "!!float"
	case v == "true" || v == "false":
		return "!!bool"
	}
	return "!!str"
}

// unknownKeys reports keys that match no configuration field. yaml.v3
// checks field names only when decoding through a Decoder, so the original
// bytes are decoded once more for that purpose alone; type errors from that
// pass are ignored because values there are not yet expanded.
func unknownKeys(ix *index, data []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var scratch Config
	err := dec.Decode(&scratch)
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return
	}
	var unknown []string
	for _, m := range te.Errors {
		if strings.Contains(m, " not found in type ") {
			unknown = append(unknown, m)
		}
	}
	if len(unknown) > 0 {
		ix.decodeError(&yaml.TypeError{Errors: unknown})
	}
}

// writtenIn returns whether the document sets the key at a path to
// something other than null, merge keys and aliases followed.
func writtenIn(root *yaml.Node) func(segs []string) bool {
	var tree any
	if err := root.Decode(&tree); err != nil {
		return func([]string) bool { return false }
	}
	return func(segs []string) bool {
		n := tree
		for _, seg := range segs {
			switch m := n.(type) {
			case map[string]any:
				n = m[seg]
			case map[any]any:
				n = m[seg]
			default:
				return false
			}
		}
		return n != nil
	}
}

var (
	sourceNameRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)
	topicRe      = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
)

func (c *Config) validate(ix *index) {
	if c.Warehouse.DSN == "" {
		ix.add("warehouse.dsn", "is required (or set %s)", EnvDatabaseURL)
	} else if _, err := pgx.ParseConfig(c.Warehouse.DSN); err != nil {
		ix.add("warehouse.dsn", "is not a valid PostgreSQL connection string: %s", redactErr(err))
	}
	c.check(ix, "warehouse.max_conns", "")
	if c.HTTP.Enabled() {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			ix.add("http.listen", "must be host:port or off, got %q", c.HTTP.Listen)
		}
		if t := c.HTTP.Token; t != "" {
			c.HTTP.validateToken(ix, t)
		}
	}
	for _, key := range []string{"log.level", "log.format", "ingest.memory_max_bytes", "ingest.batch_max_rows", "ingest.batch_max_bytes", "ingest.batch_max_age",
		"ingest.decode_max_bytes", "ingest.decode_max_expansion"} {
		c.check(ix, key, "")
	}

	if len(c.Sources) == 0 {
		ix.add("sources", "at least one source is required")
	}
	topics := map[string]string{}
	mirrors := map[string]string{}
	slots := map[string]string{}
	usesKafka, registryFor := false, ""
	for _, name := range c.SourceNames() {
		s := c.Sources[name]
		p := "sources." + name
		if !sourceNameRe.MatchString(name) {
			ix.add(p, "source names must match %s (they name the table raw.<source>)", sourceNameRe)
		}
		if s == nil {
			ix.add(p, "is empty")
			continue
		}
		if c.validateFormat(ix, name, s) && registryFor == "" {
			registryFor = name
		}
		if s.Dedupe != nil && (s.Kafka == nil || s.Table != nil || s.Poll != nil || s.CDC != nil) {
			ix.add(p+".dedupe", "applies to Kafka sources only")
		}
		kinds := 0
		for _, set := range []bool{s.Kafka != nil, s.Table != nil, s.Poll != nil, s.CDC != nil} {
			if set {
				kinds++
			}
		}
		if s.Mirror != nil {
			switch {
			case s.Kind() == KindDebezium:
				c.validateDebeziumMirror(ix, p, s, mirrors)
			case s.Poll != nil:
				if s.Mirror.Schema != "" {
					ix.add(p+".mirror.schema", "applies to CDC sources; a poll source's mirror is mirror.table")
				}
				c.validateMirror(ix, p, s, mirrors)
			case s.CDC != nil:
				c.validateCDCMirror(ix, p, s, mirrors)
			default:
				ix.add(p+".mirror", "applies to poll, CDC and Debezium sources only")
			}
			for key, set := range map[string]bool{"position_column": s.Mirror.PositionColumn != "",
				"source_dsn": s.Mirror.SourceDSN != "", "source_table": s.Mirror.SourceTable != ""} {
				if set && s.Kind() != KindDebezium {
					ix.add(p+".mirror."+key, "applies to Debezium sources (format: debezium) only")
				}
			}
		}
		switch {
		case kinds > 1:
			ix.add(p, "has more than one of the kafka, table, poll and cdc blocks; a source reads one")
			continue
		case s.Table != nil:
			c.validateTableSource(ix, p, s)
			continue
		case s.Poll != nil:
			c.validatePollSource(ix, p, s)
			c.check(ix, "sources.<name>.raw_partition", name)
			continue
		case s.CDC != nil:
			c.validateCDCSource(ix, p, s)
			c.check(ix, "sources.<name>.raw_partition", name)
			// One reader per slot is enforced by a lock named after the
			// slot: two sources naming one slot would wait on each other
			// (or, on one server, share its changes).
			if other, ok := slots[s.CDC.Slot]; ok {
				ix.add(p+".cdc.slot", "slot %q is also the slot of source %s; each CDC source needs a slot name of its own", s.CDC.Slot, other)
			} else {
				slots[s.CDC.Slot] = name
			}
			continue
		case s.Kafka == nil:
			ix.add(p, "needs a kafka block (kafka: {topics: [...]}), a poll block, a cdc block or a table block")
			continue
		}
		usesKafka = true
		c.validateKafkaSource(ix, name, s, topics)
	}
	if usesKafka {
		c.validateKafka(ix)
	}
	c.validateRegistry(ix, registryFor)
	c.validateAggregates(ix)
	c.validateRetention(ix)
	c.validateLimits(ix)
	for _, name := range c.AggregateNames() {
		if a := c.Aggregates[name]; a != nil && ValidTableName(a.Table) {
			schema, t := SplitTable(a.Table)
			if m := mirrors[schema+"."+t]; m != "" {
				ix.add("aggregates."+name+".table", "table %s.%s is the mirror of %s", schema, t, m)
			}
		}
	}
}

// validateKafkaSource checks source name, a Kafka source: its topics
// (each read by one source; topics maps them to their sources) and how its
// events are decoded.
func (c *Config) validateKafkaSource(ix *index, name string, s *Source, topics map[string]string) {
	p := "sources." + name
	if len(s.Kafka.Topics) == 0 {
		ix.add(p+".kafka.topics", "at least one topic is required")
	}
	for i, t := range s.Kafka.Topics {
		tp := fmt.Sprintf("%s.kafka.topics[%d]", p, i)
		switch {
		case !topicRe.MatchString(t):
			ix.add(tp, "%q is not a valid Kafka topic name", t)
		case topics[t] != "":
			ix.add(tp, "topic %q is already read by source %s", t, topics[t])
		default:
			topics[t] = name
		}
	}
	if !slices.Contains(Formats, s.Format) {
		return // validateFormat says why; the other keys depend on it
	}
	if s.Kind() == KindDebezium {
		c.validateDebeziumSource(ix, p, s)
		for _, key := range []string{"raw_partition", "watermark.out_of_orderness", "watermark.idle_timeout"} {
			c.check(ix, "sources.<name>."+key, name)
		}
		return
	}
	for _, key := range []string{"event_id_fallback", "event_time_fallback", "event_time_format", "raw_partition"} {
		c.check(ix, "sources.<name>."+key, name)
	}
	checkPointer(ix, p+".event_id", s.EventID, s.EventIDFallback != "")
	checkPointer(ix, p+".event_time", s.EventTime, s.EventTimeFallback != "")
	for _, key := range []string{"max_age", "max_future_skew", "watermark.out_of_orderness", "watermark.idle_timeout"} {
		c.check(ix, "sources.<name>."+key, name)
	}
	if d := s.Dedupe; d != nil && c.check(ix, "sources.<name>.dedupe.by", name) {
		switch {
		case d.By == DedupeEventID && d.Window == 0:
			ix.add(p+".dedupe.window", "is required with dedupe.by: %s", DedupeEventID)
		case d.Window != 0:
			c.check(ix, "sources.<name>.dedupe.window", name)
		}
	}
}

// Distributes reports whether, on a Citus warehouse, the tables tidemark
// creates for the source called name (its raw table, and its mirrors for
// CDC and Debezium sources) are created distributed: unless
// warehouse.distribute is false or the source is a poll source, whose
// merge statement writes its mirror and its change table at once, which
// Citus does not plan over distributed tables.
func (c *Config) Distributes(name string) bool {
	s := c.Sources[name]
	return c.Warehouse.Distribute && s != nil && s.Poll == nil
}

// SourceNames returns the source names in sorted order.
func (c *Config) SourceNames() []string {
	names := make([]string, 0, len(c.Sources))
	for n := range c.Sources {
		names = append(names, n)
	}
	sortStrings(names)
	return names
}

func sortStrings(s []string) { sort.Strings(s) }

// oneOf reports v at path unless it is one of allowed, and returns
// whether it is.
func oneOf(ix *index, path, v string, allowed ...string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	var shown []string
	for _, a := range allowed {
		if a != "" {
			shown = append(shown, a)
		}
	}
	ix.add(path, "must be one of %s, got %q", strings.Join(shown, ", "), v)
	return false
}

func checkPointer(ix *index, path, ptr string, optional bool) {
	if ptr == "" {
		if !optional {
			ix.add(path, "is required: a JSON pointer such as /event_id (RFC 6901)")
		}
		return
	}
	if err := ValidPointer(ptr); err != nil {
		ix.add(path, "%v", err)
	}
}

// ValidPointer checks JSON pointer syntax (RFC 6901). The empty pointer,
// which names the whole document, is not accepted for event fields.
func ValidPointer(ptr string) error {
	if !strings.HasPrefix(ptr, "/") {
		return fmt.Errorf("%q is not a JSON pointer: it must start with / (for example /event_id)", ptr)
	}
	for i := 0; i < len(ptr); i++ {
		if ptr[i] == '~' && (i+1 >= len(ptr) || (ptr[i+1] != '0' && ptr[i+1] != '1')) {
			return fmt.Errorf("%q is not a JSON pointer: ~ must be followed by 0 or 1", ptr)
		}
	}
	return nil
}

// redactErr describes a DSN parse error without echoing a password. pgx
// quotes the connection string in its errors and masks passwords only on
// a best-effort basis (not "password = x" with spaces, for one), and the
// URL parser's own error quotes the whole URL, so the message keeps only
// pgx's reason and drops both.
func redactErr(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "it cannot be parsed"
	}
	msg := pe.Error()
	if inner := pe.Unwrap(); inner != nil {
		msg = strings.TrimSuffix(msg, " ("+inner.Error()+")")
	}
	if i := strings.LastIndex(msg, "`: "); i >= 0 && strings.HasPrefix(msg, "cannot parse `") {
		return msg[i+len("`: "):]
	}
	return "it cannot be parsed"
}
