package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSchemaRegistryKeys checks the format of sources and the
// schema_registry block: the valid combinations, and that every problem
// names its key.
func TestSchemaRegistryKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pw, empty, tok := write("pw", "s3cret\n"), write("empty", "\n"), write("token", "tok\n")
	missing := filepath.Join(dir, "missing")
	// doc is base() with the source's format (line 11) and the registry
	// block from line 12.
	doc := func(format string, registry ...string) string {
		return base(append([]string{"    format: " + format, "schema_registry:"}, registry...)...)
	}
	valid := []struct {
		name  string
		data  string
		check func(*Config) bool
	}{
		{"json by default", base(), func(c *Config) bool { return c.Sources["app_events"].Format == FormatJSON }},
		{"avro", doc(FormatAvro, "  url: http://registry:8081"), func(c *Config) bool {
			return c.Sources["app_events"].Format == FormatAvro && c.SchemaRegistry.Timeout.Duration() == 10*time.Second
		}},
		{"basic with password_file", doc(FormatProtobuf, "  url: https://registry", "  basic: {username: u, password_file: "+pw+"}"),
			func(c *Config) bool { return c.SchemaRegistry.Basic.Password == "s3cret" }},
		{"bearer and tls", doc(FormatJSONSchema, "  url: https://registry", "  bearer: {token_file: "+tok+"}",
			"  tls: {server_name: sr, insecure_skip_verify: true}", "  timeout: 2s"),
			func(c *Config) bool {
				return c.SchemaRegistry.Bearer.TokenFile == tok && c.SchemaRegistry.TLS.InsecureSkipVerify && c.SchemaRegistry.Timeout.Duration() == 2*time.Second
			}},
	}
	for _, tt := range valid {
		t.Run(tt.name, func(t *testing.T) {
			if cfg := mustParse(t, tt.data, nil); !tt.check(cfg) {
				t.Errorf("unexpected configuration %+v", cfg.SchemaRegistry)
			}
		})
	}

	invalid := []struct {
		name string
		data string
		want []wantErr
	}{
		{"avro without url", base("    format: avro"), []wantErr{{0, "schema_registry.url", "is required by sources.app_events.format: avro"}}},
		{"unknown format", base("    format: xml"), []wantErr{{11, "sources.app_events.format", `must be one of json, avro, protobuf, json_schema, debezium, got "xml"`}}},
		{"format on a table source", base("  partner:",
			"    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}", "    format: avro"),
			[]wantErr{{13, "sources.partner.format", "applies to Kafka sources only"}}},
		{"bad url", doc(FormatAvro, "  url: registry:8081"), []wantErr{{13, "schema_registry.url", "must be an http:// or https:// URL"}}},
		{"credentials in url", doc(FormatAvro, "  url: http://u:p@registry"), []wantErr{{13, "schema_registry.url", "must not hold credentials"}}},
		{"basic without username", doc(FormatAvro, "  url: http://registry", "  basic: {password: p}"),
			[]wantErr{{14, "schema_registry.basic.username", "is required"}}},
		{"basic without password", doc(FormatAvro, "  url: http://registry", "  basic: {username: u}"),
			[]wantErr{{14, "schema_registry.basic.password", "is required"}}},
		{"password and password_file", doc(FormatAvro, "  url: http://registry", "  basic: {username: u, password: p, password_file: "+pw+"}"),
			[]wantErr{{14, "schema_registry.basic.password_file", "both set"}}},
		{"empty password_file", doc(FormatAvro, "  url: http://registry", "  basic: {username: u, password_file: "+empty+"}"),
			[]wantErr{{14, "schema_registry.basic.password_file", "is empty"}}},
		{"basic and bearer", doc(FormatAvro, "  url: http://registry", "  basic: {username: u, password: p}", "  bearer: {token_file: "+tok+"}"),
			[]wantErr{{15, "schema_registry.bearer.token_file", "mutually exclusive"}}},
		{"missing token_file", doc(FormatAvro, "  url: http://registry", "  bearer: {token_file: "+missing+"}"),
			[]wantErr{{14, "schema_registry.bearer.token_file", "cannot read"}}},
		{"tls on http", doc(FormatAvro, "  url: http://registry", "  tls: {server_name: x}"),
			[]wantErr{{14, "schema_registry.tls", "https:// URL only"}}},
		{"cert without key", doc(FormatAvro, "  url: https://registry", "  tls: {cert_file: "+pw+"}"),
			[]wantErr{{14, "schema_registry.tls.cert_file", "given together"}}},
		{"missing ca_file", doc(FormatAvro, "  url: https://registry", "  tls: {ca_file: "+missing+"}"),
			[]wantErr{{14, "schema_registry.tls.ca_file", "cannot read"}}},
		{"timeout too long", doc(FormatAvro, "  url: https://registry", "  timeout: 2m"),
			[]wantErr{{14, "schema_registry.timeout", "between 100ms and 1m"}}},
		{"timeout against the rebalance", doc(FormatAvro, "  url: https://registry", "  timeout: 30s"),
			[]wantErr{{14, "schema_registry.timeout", "must be less than half of kafka.rebalance_timeout (1m0s)"}}},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.data, nil)
			if len(errs) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(tt.want), errs)
			}
			for i, w := range tt.want {
				e := errs[i]
				if e.Key != w.key || !strings.Contains(e.Msg, w.msg) || (w.line != 0 && e.Line != w.line) {
					t.Errorf("error %d = %d %s: %s; want %d %s: ...%s...", i, e.Line, e.Key, e.Msg, w.line, w.key, w.msg)
				}
			}
		})
	}
}

// TestSchemaRegistryTimeoutDefault checks that schema_registry.timeout,
// left out, is 10s or a quarter of kafka.rebalance_timeout if smaller
// (100ms at least), so that a configuration that sets neither or only
// the rebalance timeout loads; and that a timeout set too large for the
// rebalance timeout is refused naming it, as is a rebalance timeout too
// short for any.
func TestSchemaRegistryTimeoutDefault(t *testing.T) {
	// doc is an avro source with the registry; rebalance and timeout,
	// when not empty, set kafka.rebalance_timeout and
	// schema_registry.timeout.
	doc := func(rebalance, timeout string) string {
		data := base("    format: avro", "schema_registry:", "  url: http://registry:8081")
		if timeout != "" {
			data += "  timeout: " + timeout + "\n"
		}
		if rebalance != "" {
			data = strings.Replace(data, "kafka:\n", "kafka:\n  rebalance_timeout: "+rebalance+"\n", 1)
		}
		return data
	}
	valid := []struct {
		name, rebalance, timeout string
		want                     time.Duration
	}{
		{"neither set", "", "", 10 * time.Second},
		{"rebalance_timeout 10s", "10s", "", 2500 * time.Millisecond},
		{"rebalance_timeout 2m", "2m", "", 10 * time.Second},
		{"rebalance_timeout 300ms", "300ms", "", 100 * time.Millisecond},
		{"timeout set below half", "10s", "4s", 4 * time.Second},
		{"timeout set beside the default rebalance", "", "20s", 20 * time.Second},
	}
	for _, tt := range valid {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, doc(tt.rebalance, tt.timeout), nil).SchemaRegistry.Timeout.Duration(); got != tt.want {
				t.Errorf("timeout %s, want %s", got, tt.want)
			}
		})
	}
	invalid := []struct {
		name, rebalance, timeout string
		want                     wantErr
	}{
		{"timeout set at half", "10s", "5s", wantErr{0, "schema_registry.timeout",
			"must be less than half of kafka.rebalance_timeout (10s), got 5s"}},
		{"timeout set beyond it", "10s", "30s", wantErr{0, "schema_registry.timeout", "must be less than half of kafka.rebalance_timeout (10s)"}},
		{"rebalance_timeout too short for any", "200ms", "", wantErr{4, "kafka.rebalance_timeout",
			"must be more than 200ms with a source of a registry format (sources.app_events)"}},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, doc(tt.rebalance, tt.timeout), nil)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), errs)
			}
			e, w := errs[0], tt.want
			if e.Key != w.key || !strings.Contains(e.Msg, w.msg) || (w.line != 0 && e.Line != w.line) {
				t.Errorf("error = %d %s: %s; want %d %s: ...%s...", e.Line, e.Key, e.Msg, w.line, w.key, w.msg)
			}
		})
	}
}
