package mirror_test

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// at parses "2006-01-02 15:04" as UTC.
func at(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		panic(err)
	}
	return t
}

// testLogger discards the log unless TIDEMARK_TEST_LOG is set.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if os.Getenv("TIDEMARK_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
