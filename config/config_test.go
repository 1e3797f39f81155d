package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const file = "tidemark.yaml"

// lines joins YAML lines so that a test can count them: the first is line 1.
func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

// base is a minimal valid file of ten lines; extra lines start at line 11.
func base(extra ...string) string {
	return lines(append([]string{
		"warehouse:",                            // 1
		"  dsn: postgres://localhost/warehouse", // 2
		"kafka:",                                // 3
		"  brokers: [localhost:9092]",           // 4
		"sources:",                              // 5
		"  app_events:",                         // 6
		"    kafka:",                            // 7
		"      topics: [app.events]",            // 8
		"    event_id: /event_id",               // 9
		"    event_time: /event_time",           // 10
	}, extra...)...)
}

// envLookup returns a lookup function over env.
func envLookup(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// mustParse parses a file that must be valid.
func mustParse(t *testing.T, data string, env map[string]string) *Config {
	t.Helper()
	cfg, err := Parse(file, []byte(data), envLookup(env))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, data)
	}
	if cfg == nil {
		t.Fatal("Parse returned a nil config and no error")
	}
	return cfg
}

// parseErrors parses a file that must be invalid and returns its problems.
func parseErrors(t *testing.T, data string, env map[string]string) Errors {
	t.Helper()
	cfg, err := Parse(file, []byte(data), envLookup(env))
	if err == nil {
		t.Fatalf("Parse succeeded, want errors:\n%s", data)
	}
	if cfg != nil {
		t.Errorf("Parse returned a config along with errors")
	}
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error is %T, want config.Errors: %v", err, err)
	}
	if len(errs) == 0 {
		t.Fatalf("Parse returned empty Errors")
	}
	return errs
}

// wantErr is one expected problem: its line, dotted key and a part of its
// message.
type wantErr struct {
	line int
	key  string
	msg  string
}

// prefix is the exact start of the error text: "file:line: key: ".
func (w wantErr) prefix() string {
	loc := file
	if w.line > 0 {
		loc += fmt.Sprintf(":%d", w.line)
	}
	if w.key == "" {
		return loc + ": "
	}
	return loc + ": " + w.key + ": "
}

// checkErrors compares problems with the expected ones, in order.
func checkErrors(t *testing.T, errs Errors, want []wantErr) {
	t.Helper()
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	for i := 0; i < len(errs) && i < len(want); i++ {
		e, w := errs[i], want[i]
		if !strings.HasPrefix(e.Error(), w.prefix()) {
			t.Errorf("error %d = %q, want prefix %q", i, e.Error(), w.prefix())
		}
		if e.File != file || e.Line != w.line || e.Key != w.key {
			t.Errorf("error %d = {File:%q Line:%d Key:%q}, want {%q %d %q}", i, e.File, e.Line, e.Key, file, w.line, w.key)
		}
		if !strings.Contains(e.Msg, w.msg) {
			t.Errorf("error %d message %q does not contain %q", i, e.Msg, w.msg)
		}
	}
	text := errs.Error()
	for _, e := range errs {
		if !strings.Contains(text, e.Error()) {
			t.Errorf("Errors.Error() %q lacks %q", text, e.Error())
		}
	}
}

func TestParseFullFile(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not checked here"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := lines(
		"# tidemark configuration",
		"warehouse:",
		"  dsn: postgres://tidemark@db.internal:5432/warehouse?sslmode=disable",
		"  migrate: false",
		"  max_conns: 16",
		"http:",
		"  listen: 0.0.0.0:9187",
		"log:",
		"  level: debug",
		"  format: json",
		"kafka:",
		"  brokers:",
		"    - kafka-1:9092",
		"    - kafka-2:9092",
		"  group: loaders",
		"  client_id: tidemark-1",
		"  start_offset: latest",
		"  session_timeout: 30s",
		"  rebalance_timeout: 2m",
		"  fetch_max_bytes: 32MiB",
		"  tls:",
		"    ca_file: "+ca,
		"    server_name: kafka.internal",
		"    insecure_skip_verify: true",
		"  sasl:",
		"    mechanism: SCRAM-SHA-512",
		"    username: loader",
		"    password: s3cret",
		"    allow_plaintext: true",
		"ingest:",
		"  batch_max_rows: 5000",
		"  batch_max_bytes: 8MiB",
		"  batch_max_age: 250ms",
		"  decode_max_bytes: 8MiB",
		"  decode_max_expansion: 16",
		"sources:",
		"  app_events:",
		"    kafka:",
		"      topics: [app.events, app.events.v2]",
		"    event_id: /meta/id",
		"    event_time: /meta/ts",
		"    event_time_format: rfc3339",
		"    max_age: 30d",
		"    max_future_skew: 10m",
		"    raw_partition: month",
		"    watermark:",
		"      out_of_orderness: 5m",
		"      idle_timeout: 1m",
		"  billing:",
		"    kafka:",
		"      topics:",
		"        - billing",
		"    event_id_fallback: coordinates",
		"    event_time: /ts",
		"    event_time_format: unix_millis",
		"    event_time_fallback: record_timestamp",
	)
	cfg := mustParse(t, data, nil)
	tr := true
	want := &Config{
		Warehouse: Warehouse{DSN: "postgres://tidemark@db.internal:5432/warehouse?sslmode=disable", Migrate: false, MaxConns: 16, Distribute: true,
			WarehouseLimits: defaultLimits},
		HTTP: HTTP{Listen: "0.0.0.0:9187"},
		Log:  Log{Level: "debug", Format: "json"},
		Kafka: Kafka{
			Brokers:                []string{"kafka-1:9092", "kafka-2:9092"},
			Group:                  "loaders",
			ClientID:               "tidemark-1",
			StartOffset:            "latest",
			SessionTimeout:         Duration(30 * time.Second),
			RebalanceTimeout:       Duration(2 * time.Minute),
			FetchMaxBytes:          32 << 20,
			FetchMaxPartitionBytes: 1 << 20,
			TLS:                    &TLS{Enabled: true, CAFile: ca, ServerName: "kafka.internal", InsecureSkipVerify: tr},
			SASL:                   &SASL{Mechanism: "SCRAM-SHA-512", Username: "loader", Password: "s3cret", AllowPlaintext: true},
		},
		SchemaRegistry: defaultRegistry,
		Ingest: Ingest{MemoryMaxBytes: 48 << 20, BatchMaxRows: 5000, BatchMaxBytes: 8 << 20, BatchMaxAge: Duration(250 * time.Millisecond),
			DecodeMaxBytes: 8 << 20, DecodeMaxExpansion: 16},
		Reconcile: Reconcile{Every: Duration(time.Minute), MaxPartitionsPerRun: 100, RunTimeout: Duration(10 * time.Minute)},
		Retention: defaultRetention,
		Sources: map[string]*Source{
			"app_events": {
				Kafka:             &KafkaSource{Topics: []string{"app.events", "app.events.v2"}},
				EventID:           "/meta/id",
				EventTime:         "/meta/ts",
				Format:            FormatJSON,
				EventTimeFormat:   TimeRFC3339,
				MaxAge:            Duration(30 * 24 * time.Hour),
				MaxFutureSkew:     Duration(10 * time.Minute),
				RawPartition:      PartitionMonth,
				Watermark:         Watermark{OutOfOrderness: Duration(5 * time.Minute), IdleTimeout: Duration(time.Minute)},
				Retention:         defaultSourceRetention,
				Name:              "app_events",
				EventIDFallback:   "",
				EventTimeFallback: "",
				Decode:            DecodeLimits{MaxBytes: 8 << 20, Expansion: 16},
			},
			"billing": {
				Kafka:             &KafkaSource{Topics: []string{"billing"}},
				Format:            FormatJSON,
				EventIDFallback:   FallbackCoordinates,
				EventTime:         "/ts",
				EventTimeFormat:   TimeUnixMillis,
				EventTimeFallback: FallbackRecordTimestamp,
				MaxAge:            Duration(90 * 24 * time.Hour),
				MaxFutureSkew:     Duration(time.Hour),
				RawPartition:      PartitionDay,
				Watermark:         Watermark{IdleTimeout: Duration(5 * time.Minute)},
				Retention:         defaultSourceRetention,
				Name:              "billing",
				Decode:            DecodeLimits{MaxBytes: 8 << 20, Expansion: 16},
			},
		},
		File: file,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", cfg, want)
		for _, n := range cfg.SourceNames() {
			t.Logf("source %s: %+v", n, cfg.Sources[n])
		}
	}
	if cfg.Warehouse.Migrate {
		t.Error("Migrate = true with migrate: false")
	}
	if !cfg.HTTP.Enabled() {
		t.Error("HTTP.Enabled() = false")
	}
	if !cfg.Kafka.TLS.On() {
		t.Error("TLS.On() = false for a tls block without enabled")
	}
	if got := cfg.SourceNames(); !reflect.DeepEqual(got, []string{"app_events", "billing"}) {
		t.Errorf("SourceNames() = %q", got)
	}
}

// The limits and retention every configuration gets when it sets none.
var (
	defaultLimits    = WarehouseLimits{IdleInTransactionSessionTimeout: Duration(5 * time.Minute), WriteTimeout: Duration(2 * time.Minute)}
	defaultRetention = Retention{
		Every: Duration(time.Hour), Ledger: Duration(7 * 24 * time.Hour), Corrections: Duration(90 * 24 * time.Hour),
		Arrivals: Duration(90 * 24 * time.Hour), Runs: Duration(90 * 24 * time.Hour), LockTimeout: Duration(2 * time.Second),
	}
	defaultRegistry = SchemaRegistry{Timeout: Duration(10 * time.Second)}
	defaultIngest   = Ingest{MemoryMaxBytes: 18 << 20, BatchMaxRows: 50000, BatchMaxBytes: 6 << 20, BatchMaxAge: Duration(time.Second),
		DecodeMaxBytes: 64 << 20, DecodeMaxExpansion: 64}
	defaultDecode          = DecodeLimits{MaxBytes: 64 << 20, Expansion: 64}
	defaultSourceRetention = SourceRetention{Raw: Duration(400 * 24 * time.Hour), DeadLetters: Duration(30 * 24 * time.Hour)}
)

func TestParseDefaults(t *testing.T) {
	cfg := mustParse(t, base(), nil)
	want := &Config{
		Warehouse: Warehouse{DSN: "postgres://localhost/warehouse", Migrate: true, MaxConns: 8, Distribute: true, WarehouseLimits: defaultLimits},
		HTTP:      HTTP{Listen: "127.0.0.1:9187"},
		Log:       Log{Level: "info", Format: "text"},
		Kafka: Kafka{
			Brokers:                []string{"localhost:9092"},
			Group:                  "tidemark",
			ClientID:               "tidemark",
			StartOffset:            "earliest",
			SessionTimeout:         Duration(45 * time.Second),
			RebalanceTimeout:       Duration(60 * time.Second),
			FetchMaxBytes:          6 << 20,
			FetchMaxPartitionBytes: 1 << 20,
		},
		SchemaRegistry: defaultRegistry,
		Ingest:         defaultIngest,
		Reconcile:      Reconcile{Every: Duration(time.Minute), MaxPartitionsPerRun: 100, RunTimeout: Duration(10 * time.Minute)},
		Retention:      defaultRetention,
		Sources: map[string]*Source{
			"app_events": {
				Kafka:           &KafkaSource{Topics: []string{"app.events"}},
				EventID:         "/event_id",
				EventTime:       "/event_time",
				Format:          FormatJSON,
				EventTimeFormat: TimeAuto,
				MaxAge:          Duration(90 * 24 * time.Hour),
				MaxFutureSkew:   Duration(time.Hour),
				RawPartition:    PartitionDay,
				Watermark:       Watermark{OutOfOrderness: 0, IdleTimeout: Duration(5 * time.Minute)},
				Retention:       defaultSourceRetention,
				Name:            "app_events",
				Decode:          defaultDecode,
			},
		},
		File: file,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v\nsource: %+v", cfg, want, cfg.Sources["app_events"])
	}
	if !cfg.Warehouse.Migrate {
		t.Error("Migrate = false by default")
	}
	if cfg.Kafka.TLS.On() {
		t.Error("TLS.On() = true without a tls block")
	}
}

// replace returns base() with one line replaced (or, with a trailing
// newline in new, extended in place); it fails loudly on a typo.
func replace(t *testing.T, old, new string) string {
	t.Helper()
	b := base()
	if !strings.Contains(b, old) {
		t.Fatalf("base has no %q", old)
	}
	return strings.Replace(b, old, new, 1)
}

// TestParseSettings checks single settings and their effect.
func TestParseSettings(t *testing.T) {
	tests := []struct {
		name  string
		data  func(t *testing.T) string
		env   map[string]string
		check func(*Config) bool
	}{
		{"http off", func(*testing.T) string { return base("http:", "  listen: off") }, nil,
			func(c *Config) bool { return c.HTTP.Listen == "off" && !c.HTTP.Enabled() }},
		{"migrate true", func(t *testing.T) string { return replace(t, "warehouse:\n", "warehouse:\n  migrate: true\n") }, nil,
			func(c *Config) bool { return c.Warehouse.Migrate }},
		{"distribute false", func(t *testing.T) string { return replace(t, "warehouse:\n", "warehouse:\n  distribute: false\n") }, nil,
			func(c *Config) bool { return !c.Warehouse.Distribute }},
		{"tls disabled", func(t *testing.T) string { return replace(t, "kafka:\n", "kafka:\n  tls:\n    enabled: false\n") }, nil,
			func(c *Config) bool { return c.Kafka.TLS != nil && !c.Kafka.TLS.On() }},
		{"plain byte size", func(*testing.T) string { return base("ingest:", "  batch_max_bytes: 1048576") }, nil,
			func(c *Config) bool { return c.Ingest.BatchMaxBytes == 1<<20 }},
		{"decimal byte size", func(*testing.T) string { return base("ingest:", "  batch_max_bytes: 10MB") }, nil,
			func(c *Config) bool { return c.Ingest.BatchMaxBytes == 10_000_000 }},
		{"memory budget shared in thirds", func(*testing.T) string { return base("ingest:", "  memory_max_bytes: 12MiB") }, nil,
			func(c *Config) bool {
				return c.Ingest.MemoryMaxBytes == 12<<20 && c.Kafka.FetchMaxBytes == 4<<20 && c.Ingest.BatchMaxBytes == 4<<20
			}},
		{"memory budget holds a written batch size", func(*testing.T) string { return base("ingest:", "  batch_max_bytes: 10MiB") }, nil,
			func(c *Config) bool { return c.Ingest.MemoryMaxBytes == 26<<20 && c.Kafka.FetchMaxBytes == 6<<20 }},
		{"memory budget holds a written fetch size", func(t *testing.T) string {
			return replace(t, "kafka:\n", "kafka:\n  fetch_max_bytes: 64MiB\n")
		}, nil,
			func(c *Config) bool { return c.Ingest.MemoryMaxBytes == 76<<20 && c.Ingest.BatchMaxBytes == 6<<20 }},
		{"day and hour duration", func(*testing.T) string { return base("    max_age: 1d12h") }, nil,
			func(c *Config) bool { return c.Sources["app_events"].MaxAge == Duration(36*time.Hour) }},
		{"quoted duration", func(*testing.T) string { return base(`    max_future_skew: "90m"`) }, nil,
			func(c *Config) bool { return c.Sources["app_events"].MaxFutureSkew == Duration(90*time.Minute) }},
		{"zero duration means the default", func(*testing.T) string { return base("    max_age: 0") }, nil,
			func(c *Config) bool { return c.Sources["app_events"].MaxAge == Duration(90*24*time.Hour) }},
		{"only the id fallback", func(t *testing.T) string {
			return replace(t, "    event_id: /event_id\n", "    event_id_fallback: coordinates\n")
		}, nil,
			func(c *Config) bool {
				s := c.Sources["app_events"]
				return s.EventID == "" && s.EventIDFallback == FallbackCoordinates
			}},
		{"only the time fallback", func(t *testing.T) string {
			return replace(t, "    event_time: /event_time\n", "    event_time_fallback: record_timestamp\n")
		}, nil,
			func(c *Config) bool {
				s := c.Sources["app_events"]
				return s.EventTime == "" && s.EventTimeFallback == FallbackRecordTimestamp
			}},
		{"pointer escapes", func(t *testing.T) string { return replace(t, "event_id: /event_id", "event_id: /a~1b/~0/0") }, nil,
			func(c *Config) bool { return c.Sources["app_events"].EventID == "/a~1b/~0/0" }},
		{"dsn from TIDEMARK_DATABASE_URL", func(t *testing.T) string {
			return replace(t, "warehouse:\n  dsn: postgres://localhost/warehouse\n", "")
		}, map[string]string{EnvDatabaseURL: "postgres://env/db"},
			func(c *Config) bool { return c.Warehouse.DSN == "postgres://env/db" }},
		{"dsn in the file wins over TIDEMARK_DATABASE_URL", func(*testing.T) string { return base() },
			map[string]string{EnvDatabaseURL: "postgres://env/db"},
			func(c *Config) bool { return c.Warehouse.DSN == "postgres://localhost/warehouse" }},
		{"keyword dsn", func(t *testing.T) string {
			return replace(t, "dsn: postgres://localhost/warehouse", "dsn: host=db port=5432 dbname=w user=u")
		}, nil,
			func(c *Config) bool { return c.Warehouse.DSN == "host=db port=5432 dbname=w user=u" }},
		{"ipv6 broker", func(t *testing.T) string { return replace(t, "[localhost:9092]", "['[::1]:9092']") }, nil,
			func(c *Config) bool { return c.Kafka.Brokers[0] == "[::1]:9092" }},
		{"longest source name", func(t *testing.T) string { return replace(t, "  app_events:", "  "+strings.Repeat("s", 40)+":") }, nil,
			func(c *Config) bool { return c.Sources[strings.Repeat("s", 40)] != nil }},
		{"month partitions", func(*testing.T) string { return base("    raw_partition: month") }, nil,
			func(c *Config) bool { return c.Sources["app_events"].RawPartition == PartitionMonth }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.data(t), tt.env)
			if !tt.check(cfg) {
				t.Errorf("unexpected config %+v", cfg)
			}
		})
	}
}

func TestParseEnvExpansion(t *testing.T) {
	env := map[string]string{
		"DB_URL":  "postgres://loader@db/warehouse",
		"HOST":    "0.0.0.0",
		"PORT":    "12",
		"EMPTY":   "",
		"LEVEL":   "warn",
		"MIGRATE": "false",
		"AGE":     "45d",
		"YAMLISH": "a: b\n- c # d",
		"NULLISH": "~",
		"NULLTXT": "null",
		"BROKER":  "kafka-9:9092",
		"NESTED":  "${HOST}",
	}
	dsn := func(t *testing.T, v string) string {
		return replace(t, "dsn: postgres://localhost/warehouse", "dsn: "+v)
	}
	kafka := func(t *testing.T, ls ...string) string {
		return replace(t, "kafka:\n", "kafka:\n"+lines(ls...))
	}
	tests := []struct {
		name string
		data func(t *testing.T) string
		get  func(*Config) any
		want any
	}{
		{"whole value", func(t *testing.T) string { return dsn(t, "${DB_URL}") },
			func(c *Config) any { return c.Warehouse.DSN }, "postgres://loader@db/warehouse"},
		{"inside text", func(t *testing.T) string { return dsn(t, "postgres://${HOST}/db") },
			func(c *Config) any { return c.Warehouse.DSN }, "postgres://0.0.0.0/db"},
		{"default unused", func(t *testing.T) string { return dsn(t, "${DB_URL:-postgres://fallback/db}") },
			func(c *Config) any { return c.Warehouse.DSN }, "postgres://loader@db/warehouse"},
		{"default used", func(t *testing.T) string { return dsn(t, "${NOPE:-postgres://fallback:5432/db?x=1}") },
			func(c *Config) any { return c.Warehouse.DSN }, "postgres://fallback:5432/db?x=1"},
		{"default used when empty", func(t *testing.T) string { return dsn(t, "${EMPTY:-postgres://fallback/db}") },
			func(c *Config) any { return c.Warehouse.DSN }, "postgres://fallback/db"},
		{"two references", func(*testing.T) string { return base("http:", "  listen: ${HOST}:${PORT}") },
			func(c *Config) any { return c.HTTP.Listen }, "0.0.0.0:12"},
		{"double quoted", func(*testing.T) string { return base("http:", `  listen: "${HOST}:9000"`) },
			func(c *Config) any { return c.HTTP.Listen }, "0.0.0.0:9000"},
		{"single quoted", func(*testing.T) string { return base("http:", `  listen: '${HOST}:9000'`) },
			func(c *Config) any { return c.HTTP.Listen }, "0.0.0.0:9000"},
		{"dollar dollar", func(t *testing.T) string {
			return kafka(t, "  sasl:", "    mechanism: PLAIN", "    username: u$$er", "    password: $${NOT_A_VAR}$5$", "    allow_plaintext: true")
		}, func(c *Config) any { return c.Kafka.SASL.Username + " " + c.Kafka.SASL.Password }, "u$er ${NOT_A_VAR}$5$"},
		{"dollar dollar before a reference", func(*testing.T) string { return base("http:", "  listen: $$$${HOST}:${PORT}") },
			func(c *Config) any { return c.HTTP.Listen }, "$${HOST}:12"},
		{"PORT into an integer", func(*testing.T) string { return base("ingest:", "  batch_max_rows: ${PORT}") },
			func(c *Config) any { return c.Ingest.BatchMaxRows }, Int(12)},
		{"PORT into an int32", func(t *testing.T) string { return replace(t, "warehouse:\n", "warehouse:\n  max_conns: ${PORT}\n") },
			func(c *Config) any { return c.Warehouse.MaxConns }, Int(12)},
		{"integer from a default", func(*testing.T) string { return base("ingest:", "  batch_max_rows: ${NOPE:-777}") },
			func(c *Config) any { return c.Ingest.BatchMaxRows }, Int(777)},
		{"bool", func(t *testing.T) string { return replace(t, "warehouse:\n", "warehouse:\n  migrate: ${MIGRATE}\n") },
			func(c *Config) any { return c.Warehouse.Migrate }, false},
		{"duration", func(*testing.T) string { return base("    max_age: ${AGE}") },
			func(c *Config) any { return c.Sources["app_events"].MaxAge.Duration() }, 45 * 24 * time.Hour},
		{"size from a default", func(*testing.T) string { return base("ingest:", "  batch_max_bytes: ${NOPE:-4MiB}") },
			func(c *Config) any { return c.Ingest.BatchMaxBytes }, ByteSize(4 << 20)},
		{"choice", func(*testing.T) string { return base("log:", "  level: ${LEVEL}") },
			func(c *Config) any { return c.Log.Level }, "warn"},
		{"list items", func(t *testing.T) string {
			return replace(t, "  brokers: [localhost:9092]\n", lines("  brokers:", "    - ${BROKER}", "    - ${NOPE:-kafka-10:9092}"))
		}, func(c *Config) any { return c.Kafka.Brokers }, []string{"kafka-9:9092", "kafka-10:9092"}},
		{"flow list items", func(t *testing.T) string { return replace(t, "[localhost:9092]", `["${BROKER}", '${HOST}:1']`) },
			func(c *Config) any { return c.Kafka.Brokers }, []string{"kafka-9:9092", "0.0.0.0:1"}},
		{"value does not change structure", func(t *testing.T) string { return kafka(t, "  client_id: ${YAMLISH}") },
			func(c *Config) any { return c.Kafka.ClientID }, "a: b\n- c # d"},
		{"no second round of expansion", func(*testing.T) string { return base("http:", "  listen: ${NESTED}:1") },
			func(c *Config) any { return c.HTTP.Listen }, "${HOST}:1"},
		{"null-looking values stay text", func(t *testing.T) string {
			return kafka(t, "  sasl:", "    mechanism: PLAIN", "    username: ${NULLTXT}", "    password: ${NULLISH}", "    allow_plaintext: true")
		}, func(c *Config) any { return c.Kafka.SASL.Username + " " + c.Kafka.SASL.Password }, "null ~"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.data(t)
			cfg := mustParse(t, data, env)
			if got := tt.get(cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v\n%s", got, tt.want, data)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		data string
		env  map[string]string
		want []wantErr
	}{
		// The file as a whole.
		{"empty file", "", nil, []wantErr{{0, "", "empty"}}},
		{"only a comment", "# nothing here\n", nil, []wantErr{{0, "", "empty"}}},
		{"yaml syntax error", base("log: level: debug"), nil,
			[]wantErr{{11, "", "mapping values are not allowed"}}},
		{"tab indentation", "warehouse:\n\tdsn: x\n", nil, []wantErr{{2, "", ""}}},
		{"duplicate key", base("warehouse:", "  max_conns: 4"), nil,
			[]wantErr{{11, "warehouse", "already defined"}}},

		// Unknown keys.
		{"unknown top-level key", base("bogus: 1"), nil, []wantErr{{11, "bogus", "unknown key"}}},
		{"unknown nested key", base("ingest:", "  batch_max_row: 5"), nil, []wantErr{{12, "ingest.batch_max_row", "unknown key"}}},
		{"unknown source key", base("    event_idd: /id"), nil, []wantErr{{11, "sources.app_events.event_idd", "unknown key"}}},
		{"unknown source kafka key", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]",
			"sources:", "  s:", "    kafka:", "      topics: [t]", "      partitions: 3", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{9, "sources.s.kafka.partitions", "unknown key"}}},
		{"unknown watermark key", base("    watermark:", "      lateness: 5m"), nil,
			[]wantErr{{12, "sources.app_events.watermark.lateness", "unknown key"}}},
		{"unknown sasl key", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  sasl:",
			"    mechanism: PLAIN", "    user: u", "    password: p"), nil,
			[]wantErr{{7, "kafka.sasl.user", "unknown key"}}},
		{"unknown keys everywhere", lines("warehouse:", "  dsn: postgres://h/db", "  pool: 3", "kafka:", "  brokers: [h:1]",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t", "    colour: red", "extra: true"), nil,
			[]wantErr{{3, "warehouse.pool", "unknown key"}, {11, "sources.s.colour", "unknown key"}, {12, "extra", "unknown key"}}},
		{"unknown key with unexpanded value", base("    tz: ${NOPE}"), nil,
			[]wantErr{{11, "sources.app_events.tz", "environment variable NOPE is not set"}, {11, "sources.app_events.tz", "unknown key"}}},
		{"unknown key and wrong type", base("ingest:", "  batch_max_rows: lots", "  flush: now"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", "expected an integer"}, {13, "ingest.flush", "unknown key"}}},
		{"unknown key in a flow mapping", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]",
			"sources:", "  s: {event_idd: /i, kafka: {topics: [t]}, event_time: /t}"), nil,
			[]wantErr{{6, "sources.s.event_idd", "unknown key"}}},

		// Wrong types.
		{"string for an integer", base("ingest:", "  batch_max_rows: lots"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", `expected an integer, got the string "lots"`}}},
		{"string for an int32", lines("warehouse:", "  dsn: postgres://h/db", "  max_conns: lots"), nil,
			[]wantErr{{3, "warehouse.max_conns", `expected an integer, got the string "lots"`}}},
		{"fraction for an integer", base("ingest:", "  batch_max_rows: 2500.5"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", "integer"}}},
		{"quoted env reference stays a string", base("ingest:", `  batch_max_rows: "${PORT}"`), map[string]string{"PORT": "12"},
			[]wantErr{{12, "ingest.batch_max_rows", `expected an integer, got the string "12"`}}},
		{"string for a bool", lines("warehouse:", "  dsn: postgres://h/db", "  migrate: maybe"), nil,
			[]wantErr{{3, "warehouse.migrate", `expected true or false, got the string "maybe"`}}},
		{"string for a list", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: h:9092"), nil,
			[]wantErr{{4, "kafka.brokers", `expected a list, got the string "h:9092"`}}},
		{"list for a mapping", lines("warehouse:", "  dsn: postgres://h/db", "kafka: [h:9092]"), nil,
			[]wantErr{{3, "kafka", "expected a mapping, got a list"}}},
		{"list for a duration", base("ingest:", "  batch_max_age: [1s]"), nil,
			[]wantErr{{12, "ingest.batch_max_age", "expected a duration"}}},
		{"list for a size", base("ingest:", "  batch_max_bytes: [1MiB]"), nil,
			[]wantErr{{12, "ingest.batch_max_bytes", "expected a size"}}},
		{"mapping for a topic list", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "sources:", "  s:",
			"    kafka:", "      topics: {t: 1}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{8, "sources.s.kafka.topics", "expected a list, got a mapping"}}},

		// Environment references.
		{"unset variable", base("log:", "  level: ${LOG_LEVEL}"), nil,
			[]wantErr{{12, "log.level", "environment variable LOG_LEVEL is not set"}}},
		{"unset variable in dsn", strings.Replace(base(), "postgres://localhost/warehouse", "postgres://${DB_HOST}/w", 1), nil,
			[]wantErr{{2, "warehouse.dsn", "environment variable DB_HOST is not set"}}},
		{"two unset variables", base("http:", "  listen: ${H}:${P}"), nil,
			[]wantErr{{12, "http.listen", "environment variable H is not set"}, {12, "http.listen", "environment variable P is not set"}}},
		{"unset variable in a flow list", strings.Replace(base(), "[localhost:9092]", "[localhost:9092, \"${BROKER2}\"]", 1), nil,
			[]wantErr{{4, "kafka.brokers[1]", "environment variable BROKER2 is not set"}}},
		{"unset variable in a block list", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers:", "    - h:1", "    - ${BROKER}",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{6, "kafka.brokers[1]", "environment variable BROKER is not set"}}},
		{"unset variable in an integer", base("ingest:", "  batch_max_rows: ${ROWS}"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", "environment variable ROWS is not set"}}},
		{"unset variable as the whole document", lines("", "${NOPE}"), nil,
			[]wantErr{{2, "", "environment variable NOPE is not set"}}},

		// warehouse.
		{"missing dsn without warehouse block", lines("kafka:", "  brokers: [h:1]", "sources:", "  s:",
			"    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{0, "warehouse.dsn", "is required (or set TIDEMARK_DATABASE_URL)"}}},
		{"missing dsn in warehouse block", lines("warehouse:", "  max_conns: 4", "kafka:", "  brokers: [h:1]", "sources:", "  s:",
			"    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{1, "warehouse.dsn", "is required"}}},
		{"empty TIDEMARK_DATABASE_URL", lines("warehouse:", "  max_conns: 4", "kafka:", "  brokers: [h:1]", "sources:", "  s:",
			"    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), map[string]string{EnvDatabaseURL: ""},
			[]wantErr{{1, "warehouse.dsn", "is required"}}},
		{"invalid dsn hides the password", strings.Replace(base(), "postgres://localhost/warehouse", "postgres://u:hunter2@h:notaport/w", 1), nil,
			[]wantErr{{2, "warehouse.dsn", "is not a valid PostgreSQL connection string"}}},
		{"max_conns too small", strings.Replace(base(), "warehouse:\n", "warehouse:\n  max_conns: 1\n", 1), nil,
			[]wantErr{{2, "warehouse.max_conns", "must be between 2 and 1000"}}},

		// http, log, ingest.
		{"listen without port", base("http:", "  listen: 9187"), nil, []wantErr{{12, "http.listen", "must be host:port or off"}}},
		{"log level", base("log:", "  level: verbose"), nil, []wantErr{{12, "log.level", `must be one of debug, info, warn, error, got "verbose"`}}},
		{"log format", base("log:", "  format: xml"), nil, []wantErr{{12, "log.format", "must be one of text, json"}}},
		{"batch_max_rows too big", base("ingest:", "  batch_max_rows: 1000001"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", "must be between 1 and 1000000, got 1000001"}}},
		{"batch_max_rows negative", base("ingest:", "  batch_max_rows: -5"), nil,
			[]wantErr{{12, "ingest.batch_max_rows", "must be between 1 and 1000000, got -5"}}},
		{"batch_max_bytes too small", base("ingest:", "  batch_max_bytes: 1000B"), nil,
			[]wantErr{{12, "ingest.batch_max_bytes", "must be at least 1KiB"}}},
		{"batch_max_age too small", base("ingest:", "  batch_max_age: 500us"), nil,
			[]wantErr{{12, "ingest.batch_max_age", "must be at least 1ms"}}},
		{"decode_max_bytes beyond jsonb", base("ingest:", "  decode_max_bytes: 1GiB"), nil,
			[]wantErr{{12, "ingest.decode_max_bytes", "must be between 1MiB and 256MiB (a jsonb value holds at most 256 MiB), got 1GiB"}}},
		{"decode_max_expansion zero", base("ingest:", "  decode_max_expansion: -1"), nil,
			[]wantErr{{12, "ingest.decode_max_expansion", "must be between 1 and 65536, got -1"}}},

		// Durations and sizes.
		{"bad duration 3x", base("    max_age: 3x"), nil, []wantErr{{11, "sources.app_events.max_age", `invalid duration "3x"`}}},
		{"bad duration words", base("ingest:", "  batch_max_age: 5 minutes"), nil,
			[]wantErr{{12, "ingest.batch_max_age", "invalid duration"}}},
		{"bad duration weeks", base("    watermark:", "      idle_timeout: 1w"), nil,
			[]wantErr{{12, "sources.app_events.watermark.idle_timeout", "invalid duration"}}},
		{"bad duration in kafka", strings.Replace(base(), "kafka:\n", "kafka:\n  session_timeout: soon\n", 1), nil,
			[]wantErr{{4, "kafka.session_timeout", "invalid duration"}}},
		{"negative max_age", base("    max_age: -1h"), nil, []wantErr{{11, "sources.app_events.max_age", "must not be negative, got -1h"}}},
		{"negative max_future_skew", base("    max_future_skew: -1s"), nil,
			[]wantErr{{11, "sources.app_events.max_future_skew", "must not be negative, got -1s"}}},
		{"negative out_of_orderness", base("    watermark:", "      out_of_orderness: -1m"), nil,
			[]wantErr{{12, "sources.app_events.watermark.out_of_orderness", "must not be negative"}}},
		{"session_timeout too small", strings.Replace(base(), "kafka:\n", "kafka:\n  session_timeout: 50ms\n", 1), nil,
			[]wantErr{{4, "kafka.session_timeout", "must be at least 100ms"}}},
		{"rebalance_timeout too small", strings.Replace(base(), "kafka:\n", "kafka:\n  rebalance_timeout: 1ms\n", 1), nil,
			[]wantErr{{4, "kafka.rebalance_timeout", "must be at least 100ms"}}},
		// PostgreSQL refuses a session that starts with a timeout above
		// 2147483647ms.
		{"session timeouts at PostgreSQL's limit", lines("warehouse:", "  dsn: postgres://h/db", "  statement_timeout: 2147483647ms",
			"  lock_timeout: 24d20h31m23.647s", "  idle_in_transaction_session_timeout: 2147483647ms", "  write_timeout: 2147483647ms"), nil,
			[]wantErr{{0, "sources", "at least one source is required"}}},
		{"session timeouts beyond PostgreSQL's limit", lines("warehouse:", "  dsn: postgres://h/db", "  statement_timeout: 2147483648ms",
			"  lock_timeout: 30d", "  idle_in_transaction_session_timeout: 106751d", "  write_timeout: 25d"), nil,
			[]wantErr{{0, "sources", "at least one source is required"},
				{3, "warehouse.statement_timeout", "must be 0 (the server's setting) or between 1ms and 2147483647ms (about 24.8 days, PostgreSQL's limit)"},
				{4, "warehouse.lock_timeout", "between 1ms and 2147483647ms"},
				{5, "warehouse.idle_in_transaction_session_timeout", "must be 0 (the server's setting) or between 1s and 2147483647ms"},
				{6, "warehouse.write_timeout", "must be between 100ms and 2147483647ms (about 24.8 days: the ingester's sessions carry it as statement_timeout"}}},
		{"write_timeout too small", lines("warehouse:", "  dsn: postgres://h/db", "  write_timeout: 10ms"), nil,
			[]wantErr{{0, "sources", "at least one source is required"}, {3, "warehouse.write_timeout", "must be between 100ms and"}}},
		{"bad size unit", base("ingest:", "  batch_max_bytes: 12QB"), nil,
			[]wantErr{{12, "ingest.batch_max_bytes", `invalid size "12QB"`}}},
		{"negative size", base("ingest:", "  batch_max_bytes: -1"), nil,
			[]wantErr{{12, "ingest.batch_max_bytes", "invalid size"}}},
		{"fractional size", base("ingest:", "  batch_max_bytes: 1.5MiB"), nil,
			[]wantErr{{12, "ingest.batch_max_bytes", "invalid size"}}},
		{"bad size in kafka", strings.Replace(base(), "kafka:\n", "kafka:\n  fetch_max_bytes: lots\n", 1), nil,
			[]wantErr{{4, "kafka.fetch_max_bytes", "invalid size"}}},
		{"memory budget too small for the fetch", base("ingest:", "  memory_max_bytes: 8MiB", "  batch_max_bytes: 4MiB"), nil,
			[]wantErr{{12, "ingest.memory_max_bytes", "must hold kafka.fetch_max_bytes (2730KiB) and twice ingest.batch_max_bytes (4MiB): at least 10922KiB, got 8MiB"}}},
		{"fetch_max_bytes too big", strings.Replace(base(), "kafka:\n", "kafka:\n  fetch_max_bytes: 2GiB\n", 1), nil,
			[]wantErr{{4, "kafka.fetch_max_bytes", "must be between 1KiB and 1GiB"}}},
		{"fetch_max_partition_bytes above fetch_max_bytes", strings.Replace(base(), "kafka:\n", "kafka:\n  fetch_max_partition_bytes: 32MiB\n", 1), nil,
			[]wantErr{{4, "kafka.fetch_max_partition_bytes", "must be between 1KiB and kafka.fetch_max_bytes (6MiB), got 32MiB"}}},
		{"fetch_max_partition_bytes too small", strings.Replace(base(), "kafka:\n", "kafka:\n  fetch_max_partition_bytes: 100\n", 1), nil,
			[]wantErr{{4, "kafka.fetch_max_partition_bytes", "must be between 1KiB"}}},
		{"fetch_max_bytes too small", strings.Replace(base(), "kafka:\n", "kafka:\n  fetch_max_bytes: 1000\n", 1), nil,
			[]wantErr{{4, "kafka.fetch_max_bytes", "must be between 1KiB and 1GiB"}}},

		// kafka.
		{"start_offset", strings.Replace(base(), "kafka:\n", "kafka:\n  start_offset: middle\n", 1), nil,
			[]wantErr{{4, "kafka.start_offset", `must be one of earliest, latest, got "middle"`}}},
		{"no brokers", lines("warehouse:", "  dsn: postgres://h/db", "sources:", "  s:",
			"    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{0, "kafka.brokers", "at least one broker"}}},
		{"empty broker list", strings.Replace(base(), "[localhost:9092]", "[]", 1), nil,
			[]wantErr{{4, "kafka.brokers", "at least one broker"}}},
		{"broker without port", strings.Replace(base(), "[localhost:9092]", "[localhost:9092, localhost]", 1), nil,
			[]wantErr{{4, "kafka.brokers[1]", `must be host:port, got "localhost"`}}},
		{"broker with empty port", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers:", "    - 'h:'",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{5, "kafka.brokers[0]", "must be host:port"}}},
		{"sasl mechanism", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  sasl:",
			"    mechanism: GSSAPI", "    username: u", "    password: p", "    allow_plaintext: true",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{6, "kafka.sasl.mechanism", `must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM, got "GSSAPI"`}}},
		{"sasl mechanism is case sensitive", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  sasl:",
			"    mechanism: plain", "    username: u", "    password: p", "    allow_plaintext: true",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{6, "kafka.sasl.mechanism", "must be one of"}}},
		{"sasl without mechanism and password", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  sasl:",
			"    username: u", "    allow_plaintext: true",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{5, "kafka.sasl.mechanism", "must be one of"}, {5, "kafka.sasl.password", "is required with SASL"}}},
		{"sasl without username", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  sasl:",
			"    mechanism: PLAIN", "    password: p", "    allow_plaintext: true",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{5, "kafka.sasl.username", "is required with SASL"}}},
		{"tls cert without key", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  tls:",
			"    cert_file: "+filepath.Join(dir, "missing.pem"),
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{6, "kafka.tls.cert_file", "cannot read"}, {6, "kafka.tls.cert_file", "must be given together"}}},
		{"tls missing ca file", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  tls:",
			"    ca_file: "+filepath.Join(dir, "ca.pem"),
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{6, "kafka.tls.ca_file", "cannot read"}}},
		{"tls disabled skips file checks", lines("warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]", "  tls:",
			"    enabled: false", "    ca_file: "+filepath.Join(dir, "ca.pem"), "  start_offset: none",
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t"), nil,
			[]wantErr{{8, "kafka.start_offset", "must be one of"}}},

		// sources.
		{"no sources", lines("warehouse:", "  dsn: postgres://h/db"), nil, []wantErr{{0, "sources", "at least one source is required"}}},
		{"empty sources", lines("warehouse:", "  dsn: postgres://h/db", "sources: {}"), nil,
			[]wantErr{{3, "sources", "at least one source is required"}}},
		{"null source", lines("warehouse:", "  dsn: postgres://h/db", "sources:", "  s:"), nil,
			[]wantErr{{4, "sources.s", "is empty"}}},
		{"source without kafka", lines("warehouse:", "  dsn: postgres://h/db", "sources:", "  s:", "    event_id: /i"), nil,
			[]wantErr{{4, "sources.s", "needs a kafka block"}}},
		{"source without topics", strings.Replace(base(), "      topics: [app.events]\n", "      topics: []\n", 1), nil,
			[]wantErr{{8, "sources.app_events.kafka.topics", "at least one topic is required"}}},
		{"bad source name", strings.Replace(base(), "  app_events:", "  App-Events:", 1), nil,
			[]wantErr{{6, "sources.App-Events", "source names must match"}}},
		{"source name starting with a digit", strings.Replace(base(), "  app_events:", "  9lives:", 1), nil,
			[]wantErr{{6, "sources.9lives", "source names must match"}}},
		{"source name too long", strings.Replace(base(), "  app_events:", "  "+strings.Repeat("s", 41)+":", 1), nil,
			[]wantErr{{6, "sources." + strings.Repeat("s", 41), "source names must match"}}},
		{"bad topic name", strings.Replace(base(), "[app.events]", "[app.events, 'bad topic']", 1), nil,
			[]wantErr{{8, "sources.app_events.kafka.topics[1]", `"bad topic" is not a valid Kafka topic name`}}},
		{"duplicate topic across sources", base(
			"  billing:",
			"    kafka:",
			"      topics:",
			"        - billing",
			"        - app.events",
			"    event_id: /i",
			"    event_time: /t"), nil,
			[]wantErr{{15, "sources.billing.kafka.topics[1]", `topic "app.events" is already read by source app_events`}}},
		{"duplicate topic within a source", strings.Replace(base(), "[app.events]", "[app.events, other, app.events]", 1), nil,
			[]wantErr{{8, "sources.app_events.kafka.topics[2]", "already read by source app_events"}}},
		{"missing event_id", strings.Replace(base(), "    event_id: /event_id\n", "", 1), nil,
			[]wantErr{{6, "sources.app_events.event_id", "is required: a JSON pointer"}}},
		{"missing event_time", strings.Replace(base(), "    event_time: /event_time\n", "", 1), nil,
			[]wantErr{{6, "sources.app_events.event_time", "is required: a JSON pointer"}}},
		{"missing event_id with the other fallback", strings.Replace(base(), "    event_id: /event_id\n", "    event_time_fallback: record_timestamp\n", 1), nil,
			[]wantErr{{6, "sources.app_events.event_id", "is required"}}},
		{"event_id not a pointer", strings.Replace(base(), "event_id: /event_id", "event_id: event_id", 1), nil,
			[]wantErr{{9, "sources.app_events.event_id", "must start with /"}}},
		{"event_time bad escape", strings.Replace(base(), "event_time: /event_time", "event_time: /a~2", 1), nil,
			[]wantErr{{10, "sources.app_events.event_time", "~ must be followed by 0 or 1"}}},
		{"event_time trailing tilde", strings.Replace(base(), "event_time: /event_time", "event_time: /a~", 1), nil,
			[]wantErr{{10, "sources.app_events.event_time", "~ must be followed by 0 or 1"}}},
		{"event_id_fallback", base("    event_id_fallback: offset"), nil,
			[]wantErr{{11, "sources.app_events.event_id_fallback", `must be one of coordinates, got "offset"`}}},
		{"event_time_fallback", base("    event_time_fallback: now"), nil,
			[]wantErr{{11, "sources.app_events.event_time_fallback", `must be one of record_timestamp, got "now"`}}},
		{"event_time_format", base("    event_time_format: iso8601"), nil,
			[]wantErr{{11, "sources.app_events.event_time_format", "must be one of auto, rfc3339, unix_seconds, unix_millis"}}},
		{"raw_partition", base("    raw_partition: week"), nil,
			[]wantErr{{11, "sources.app_events.raw_partition", "must be one of day, month"}}},

		// Several problems, sorted by line.
		{"several validation problems", lines(
			"warehouse:",
			"  max_conns: 1",
			"log:",
			"  level: loud",
			"kafka:",
			"  brokers: [h:1]",
			"  start_offset: middle",
			"sources:",
			"  b:",
			"    kafka: {topics: [t]}",
			"    event_time: x",
			"  a:",
			"    kafka: {topics: [t]}",
			"    event_id: /i",
			"    event_time: /t",
		), nil, []wantErr{
			{1, "warehouse.dsn", "is required"},
			{2, "warehouse.max_conns", "must be between 2 and 1000"},
			{4, "log.level", "must be one of"},
			{7, "kafka.start_offset", "must be one of"},
			{9, "sources.b.event_id", "is required"},
			{10, "sources.b.kafka.topics[0]", `topic "t" is already read by source a`},
			{11, "sources.b.event_time", "must start with /"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.data, tt.env)
			checkErrors(t, errs, tt.want)
			if strings.Contains(errs.Error(), "hunter2") {
				t.Errorf("errors reveal the password: %v", errs)
			}
		})
	}
}

// TestSASLNeedsTLS refuses SASL credentials on connections without TLS
// unless kafka.sasl.allow_plaintext says so.
func TestSASLNeedsTLS(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not checked here"), 0o600); err != nil {
		t.Fatal(err)
	}
	// doc is a valid configuration of ten lines with the kafka lines
	// given; the sasl block starts at line 5.
	doc := func(kafka ...string) string {
		return lines(append(append([]string{"warehouse:", "  dsn: postgres://h/db", "kafka:", "  brokers: [h:1]"}, kafka...),
			"sources:", "  s:", "    kafka: {topics: [t]}", "    event_id: /i", "    event_time: /t")...)
	}
	sasl := func(mechanism string, extra ...string) []string {
		return append([]string{"  sasl:", "    mechanism: " + mechanism, "    username: u", "    password: p"}, extra...)
	}
	refused := []wantErr{{5, "kafka.sasl", "kafka.sasl.allow_plaintext: true"}}
	tests := []struct {
		name  string
		kafka []string
		want  []wantErr // nil: accepted
		allow bool      // the parsed AllowPlaintext when accepted
	}{
		{"PLAIN without tls", sasl("PLAIN"), refused, false},
		{"SCRAM-SHA-256 without tls", sasl("SCRAM-SHA-256"), refused, false},
		{"SCRAM-SHA-512 without tls", sasl("SCRAM-SHA-512"), refused, false},
		{"allow_plaintext false", sasl("PLAIN", "    allow_plaintext: false"), []wantErr{{5, "kafka.sasl", "without TLS"}}, false},
		{"tls disabled", append(sasl("SCRAM-SHA-512"), "  tls: {enabled: false}"), refused, false},
		{"allow_plaintext true", sasl("PLAIN", "    allow_plaintext: true"), nil, true},
		{"tls", append(sasl("SCRAM-SHA-512"), "  tls: {ca_file: "+ca+"}"), nil, false},
		{"empty tls block", append(sasl("PLAIN"), "  tls: {}"), nil, false},
		{"tls and allow_plaintext", append(sasl("PLAIN", "    allow_plaintext: true"), "  tls: {ca_file: "+ca+"}"), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := doc(tt.kafka...)
			if tt.want != nil {
				checkErrors(t, parseErrors(t, data, nil), tt.want)
				return
			}
			if got := mustParse(t, data, nil).Kafka.SASL.AllowPlaintext; got != tt.allow {
				t.Errorf("AllowPlaintext = %v, want %v", got, tt.allow)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		err  Error
		want string
	}{
		{Error{File: "a.yaml", Line: 3, Key: "log.level", Msg: "bad"}, "a.yaml:3: log.level: bad"},
		{Error{File: "a.yaml", Line: 0, Key: "warehouse.dsn", Msg: "is required"}, "a.yaml: warehouse.dsn: is required"},
		{Error{File: "a.yaml", Line: 7, Msg: "syntax"}, "a.yaml:7: syntax"},
		{Error{File: "a.yaml", Msg: "the file is empty"}, "a.yaml: the file is empty"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", tt.err, got, tt.want)
		}
	}
	es := Errors{tests[0].err, tests[1].err}
	if got, want := es.Error(), tests[0].want+"\n"+tests[1].want; got != want {
		t.Errorf("Errors.Error() = %q, want %q", got, want)
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "0d", want: 0},
		{in: "3d", want: 72 * time.Hour},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "1d0s", want: 24 * time.Hour},
		{in: "2d30m15s", want: 48*time.Hour + 30*time.Minute + 15*time.Second},
		{in: "90m", want: 90 * time.Minute},
		{in: "72h", want: 72 * time.Hour},
		{in: "1m30s", want: 90 * time.Second},
		{in: "250ms", want: 250 * time.Millisecond},
		{in: "1.5h", want: 90 * time.Minute},
		{in: "100us", want: 100 * time.Microsecond},
		{in: " 5m ", want: 5 * time.Minute},
		{in: "-5m", want: -5 * time.Minute},
		{in: "106751d", want: 106751 * 24 * time.Hour},
		{in: "", bad: true},
		{in: "3", bad: true},
		{in: "3x", bad: true},
		{in: "d", bad: true},
		{in: "d1h", bad: true},
		{in: "1.5d", bad: true},
		{in: "-1d", bad: true},
		{in: "+1d", want: 24 * time.Hour},
		{in: "1dd", bad: true},
		{in: "1d1d", bad: true},
		{in: "1 d", bad: true},
		{in: "1d 2h", bad: true},
		{in: "1w", bad: true},
		{in: "1D", bad: true},
		{in: "1d3x", bad: true},
		{in: "five minutes", bad: true},
		{in: "106752d", bad: true},     // beyond time.Duration
		{in: "106751d24h", bad: true},  // the sum is beyond time.Duration
		{in: "2147483647d", bad: true}, // fits the int32 day count, not a Duration
		{in: "99999999999999999999d", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDuration(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseDuration(%q) = %v, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseDuration(%q) = %v, %v, want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

// TestParseDurationTooLong checks that a duration beyond time.Duration
// is refused as too long, not as bad text, and never wraps around.
func TestParseDurationTooLong(t *testing.T) {
	for _, in := range []string{"106752d", "1000000d", "2147483648d", "99999999999999999999d", "106751d24h",
		"2562048h", "9999999999h", "-9999999999h", "99999999999999999999ns", "1d9223372036854775807ns"} {
		t.Run(in, func(t *testing.T) {
			got, err := ParseDuration(in)
			if err == nil || !strings.Contains(err.Error(), "is too long (at most 106751d") {
				t.Errorf("ParseDuration(%q) = %v, %v, want a too-long error", in, got, err)
			}
		})
	}
}

// TestParseDurationErrorQuotesInput checks that an error names the text
// the user wrote, not a part of it.
func TestParseDurationErrorQuotesInput(t *testing.T) {
	for _, in := range []string{"3x", "1d3x", "-1d", "2d 4h"} {
		_, err := ParseDuration(in)
		if err == nil {
			t.Errorf("ParseDuration(%q) = nil error", in)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ParseDuration(%q) error %q does not quote the input", in, err)
		}
	}
}

func TestDurationString(t *testing.T) {
	tests := []struct {
		d    Duration
		want string
	}{
		{0, "0s"},
		{Duration(72 * time.Hour), "3d"},
		{Duration(24 * time.Hour), "1d"},
		{Duration(36 * time.Hour), "36h0m0s"},
		{Duration(90 * time.Minute), "1h30m0s"},
		{Duration(-24 * time.Hour), "-24h0m0s"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("Duration(%d).String() = %q, want %q", int64(tt.d), got, tt.want)
		}
		if tt.d > 0 {
			back, err := ParseDuration(tt.d.String())
			if err != nil || back != tt.d.Duration() {
				t.Errorf("ParseDuration(%q) = %v, %v, want %v", tt.d.String(), back, err, tt.d.Duration())
			}
		}
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "100B", want: 100},
		{in: "512KiB", want: 512 << 10},
		{in: "16MiB", want: 16 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: "1KB", want: 1000},
		{in: "10MB", want: 10_000_000},
		{in: "2GB", want: 2_000_000_000},
		{in: "0MiB", want: 0},
		{in: " 16 MiB ", want: 16 << 20},
		{in: "9223372036854775807", want: 1<<63 - 1},
		{in: "8589934591GiB", want: 8589934591 << 30},
		{in: "", bad: true},
		{in: "MiB", bad: true},
		{in: "B", bad: true},
		{in: "12QB", bad: true},
		{in: "16mib", bad: true},
		{in: "16M", bad: true},
		{in: "16 M", bad: true},
		{in: "1.5MiB", bad: true},
		{in: "-1", bad: true},
		{in: "-1KiB", bad: true},
		{in: "0x10", bad: true},
		{in: "1e3", bad: true},
		{in: "lots", bad: true},
		{in: "1KiBB", bad: true},
		{in: "9223372036854775808", bad: true},
		{in: "8589934592GiB", bad: true},  // 2^63: beyond int64
		{in: "17179869185GiB", bad: true}, // wraps around to 1GiB
		{in: "9223372036854775807KB", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseByteSize(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseByteSize(%q) = %d, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseByteSize(%q) = %d, %v, want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestValidPointer(t *testing.T) {
	for _, p := range []string{"/", "/a", "/a/b", "/a~0~1", "/0", "//"} {
		if err := ValidPointer(p); err != nil {
			t.Errorf("ValidPointer(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "a", "a/b", "/~", "/~2", "/a~/b"} {
		if err := ValidPointer(p); err == nil {
			t.Errorf("ValidPointer(%q) = nil, want an error", p)
		}
	}
}

// TestDistributes: the tables of Kafka, Debezium and CDC sources are
// distributed on a Citus warehouse, a poll source's are not, and none are
// under warehouse.distribute: false.
func TestDistributes(t *testing.T) {
	for _, distribute := range []bool{true, false} {
		cfg := mustParse(t, fmt.Sprintf(`warehouse:
  dsn: postgres://127.0.0.1:1/w
  distribute: %v
kafka:
  brokers: ["127.0.0.1:1"]
sources:
  clicks:
    kafka: {topics: [clicks]}
    event_id: /id
    event_time: /at
  accounts:
    kafka: {topics: [accounts]}
    format: debezium
    mirror: {table: accounts}
  orders:
    cdc: {dsn: "postgres://127.0.0.1:1/shop", tables: [orders]}
    mirror: {table: orders}
  items:
    poll: {dsn: "postgres://127.0.0.1:1/shop", table: items, key: [id], updated_at: updated_at}
    mirror: {table: items}
`, distribute), nil)
		for name, want := range map[string]bool{"clicks": true, "accounts": true, "orders": true, "items": false, "missing": false} {
			if got := cfg.Distributes(name); got != (want && distribute) {
				t.Errorf("distribute: %v: Distributes(%q) = %v, want %v", distribute, name, got, want && distribute)
			}
		}
	}
}

// TestMemoryBudget: the budgets the runtime's memory limit follows from
// are ingest.memory_max_bytes once, with any Kafka source, and twice each
// CDC source's buffer.
func TestMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources string
		want    int64
	}{
		{"kafka", "  clicks: {kafka: {topics: [clicks]}, event_id: /id, event_time: /at}\n" +
			"  views: {kafka: {topics: [views]}, event_id: /id, event_time: /at}\n", 18 << 20},
		{"cdc", "  orders: {cdc: {dsn: \"postgres://h/shop\", tables: [orders], max_buffer_bytes: 32MiB}, mirror: {table: orders}}\n" +
			"  items: {cdc: {dsn: \"postgres://h/shop\", tables: [items], slot: s2, publication: p2}, mirror: {table: items}}\n", 192 << 20},
		{"kafka and cdc", "  clicks: {kafka: {topics: [clicks]}, event_id: /id, event_time: /at}\n" +
			"  orders: {cdc: {dsn: \"postgres://h/shop\", tables: [orders]}, mirror: {table: orders}}\n", 146 << 20},
		{"poll", "  items: {poll: {dsn: \"postgres://h/shop\", table: items, key: [id], updated_at: updated_at}, mirror: {table: items}}\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("tidemark.yaml", []byte("warehouse: {dsn: postgres://localhost/w}\nkafka: {brokers: [\"localhost:9092\"]}\nsources:\n"+tc.sources), envLookup(nil))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.MemoryBudget(); got != tc.want {
				t.Errorf("MemoryBudget() = %d MiB, want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}
