package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// envMain makes the test binary act as the tidemark command, so that tests
// can run it as a subprocess (and kill it) without building it first;
// envClock, an RFC 3339 time, fixes the service clock of that command, and
// envClockFile names a file holding it, which the test rewrites to move
// the clock.
const (
	envMain      = "TIDEMARK_TEST_MAIN"
	envClock     = "TIDEMARK_TEST_CLOCK"
	envClockFile = "TIDEMARK_TEST_CLOCK_FILE"
	// envShutdownLimit replaces shutdownLimit (a duration).
	envShutdownLimit = "TIDEMARK_TEST_SHUTDOWN_LIMIT"
)

func TestMain(m *testing.M) {
	if os.Getenv(envMain) == "1" {
		if at, err := time.Parse(time.RFC3339, os.Getenv(envClock)); err == nil {
			serviceClock = func() time.Time { return at }
		}
		if f := os.Getenv(envClockFile); f != "" {
			serviceClock = fileClock(f)
		}
		if d, err := time.ParseDuration(os.Getenv(envShutdownLimit)); err == nil {
			shutdownLimit = d
		}
		main()
		return
	}
	pgtest.Main(m)
}

// fileClock reads the time in file at every call; a read that fails (the
// file being replaced) gives the time read last.
func fileClock(file string) func() time.Time {
	var mu sync.Mutex
	var last time.Time
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		if b, err := os.ReadFile(file); err == nil {
			if at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b))); err == nil {
				last = at
			}
		}
		return last
	}
}

// invoke runs the command in-process and returns its exit code and output.
func invoke(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const validConfig = `warehouse:
  dsn: postgres://tidemark@127.0.0.1:1/warehouse
kafka:
  brokers: ["127.0.0.1:1"]
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
`

// TestMalformedConfigsExit2 is acceptance item 6: malformed configurations
// exit 2 with a message naming the offending key (and its line).
func TestMalformedConfigsExit2(t *testing.T) {
	t.Setenv("TIDEMARK_DATABASE_URL", "")
	tests := []struct {
		name   string
		config string
		want   string // must appear in stderr
	}{
		{"unknown key", strings.Replace(validConfig, "    event_id: /event_id\n", "    event_id: /event_id\n    evnt_time: /ts\n", 1),
			"test.yaml:9: sources.app_events.evnt_time: unknown key"},
		{"missing event id", strings.Replace(validConfig, "    event_id: /event_id\n", "", 1),
			"sources.app_events.event_id: is required"},
		{"bad duration", validConfig + "    max_age: 3 weeks\n",
			`test.yaml:10: sources.app_events.max_age: invalid duration "3 weeks"`},
		{"broker without port", strings.Replace(validConfig, `["127.0.0.1:1"]`, `["kafka-1"]`, 1),
			`test.yaml:4: kafka.brokers[0]: must be host:port`},
		{"unset environment variable", strings.Replace(validConfig, "postgres://tidemark@127.0.0.1:1/warehouse", "${TIDEMARK_TEST_UNSET_DSN}", 1),
			"test.yaml:2: warehouse.dsn: environment variable TIDEMARK_TEST_UNSET_DSN is not set"},
		{"text for an integer", validConfig + "ingest:\n  batch_max_rows: lots\n",
			`test.yaml:11: ingest.batch_max_rows: expected an integer, got the string "lots"`},
		{"bad pointer", strings.Replace(validConfig, "event_time: /event_time", "event_time: event_time", 1),
			`test.yaml:9: sources.app_events.event_time: "event_time" is not a JSON pointer`},
		{"no warehouse", strings.Replace(validConfig, "  dsn: postgres://tidemark@127.0.0.1:1/warehouse\n", "  max_conns: 4\n", 1),
			"warehouse.dsn: is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "test.yaml")
			if err := os.WriteFile(path, []byte(tt.config), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			for _, cmd := range [][]string{{"run", "-c", "test.yaml"}, {"migrate", "--config", "test.yaml"}, {"status", "-c", "test.yaml"}} {
				code, _, stderr := invoke(t, cmd...)
				if code != exitUsage {
					t.Errorf("%s: exit code %d, want %d; stderr:\n%s", cmd[0], code, exitUsage, stderr)
				}
				if !strings.Contains(stderr, tt.want) {
					t.Errorf("%s: stderr does not contain %q:\n%s", cmd[0], tt.want, stderr)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	cfg := writeFile(t, "ok.yaml", validConfig)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"run", "--only", "ingest,teleport", "-c", cfg}, exitUsage, `unknown component "teleport"`},
		{[]string{"run", "--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"status", "-c", cfg, "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"migrate", "-c", filepath.Join(t.TempDir(), "missing.yaml")}, exitUsage, "no such file"},
		{[]string{"help"}, exitOK, "Usage:"},
		{[]string{"version"}, exitOK, "tidemark "},
		// A valid configuration pointing at nothing: a runtime failure.
		{[]string{"status", "-c", cfg}, exitFailure, "tidemark status:"},
		{[]string{"migrate", "-c", cfg}, exitFailure, "tidemark migrate:"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := invoke(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if !strings.Contains(stdout+stderr, tt.want) {
				t.Errorf("output does not contain %q\nstdout: %s\nstderr: %s", tt.want, stdout, stderr)
			}
		})
	}
}
