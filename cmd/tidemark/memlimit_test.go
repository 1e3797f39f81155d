package main

import (
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"testing"

	"github.com/tidemark-dev/tidemark/config"
)

// TestSetMemoryLimit: `tidemark run` gives the runtime a soft memory limit
// of the sources' budgets plus runtimeReserve, and leaves one GOMEMLIMIT
// sets alone.
func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	cfg, err := config.Parse("tidemark.yaml", []byte(`
warehouse: {dsn: postgres://localhost/w}
kafka: {brokers: ["localhost:9092"]}
ingest: {memory_max_bytes: 40MiB}
sources:
  clicks: {kafka: {topics: [clicks]}, event_id: /id, event_time: /at}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		env  string // GOMEMLIMIT; "-" unset
		want int64
	}{
		{"from the budgets", "-", 40<<20 + runtimeReserve},
		{"GOMEMLIMIT set", "1GiB", 123 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tc.env)
			if tc.env == "-" {
				os.Unsetenv("GOMEMLIMIT")
			}
			debug.SetMemoryLimit(123 << 20)
			setMemoryLimit(cfg, log)
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("memory limit %d, want %d", got, tc.want)
			}
		})
	}
}
