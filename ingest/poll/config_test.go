package poll_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// literalConfig is the Config of the customers source of pollEnv.config,
// written without a configuration file: the configuration's defaults,
// spelt out.
func literalConfig(srcDSN string) poll.Config {
	return poll.Config{
		Source:        "customers",
		DSN:           srcDSN,
		Table:         pgx.Identifier{"public", "src_customers"},
		Key:           []string{"customer_id"},
		UpdatedAt:     "updated_at",
		Every:         time.Minute,
		ChunkRows:     10000,
		MaxRowsPerRun: 1000000,
		Mirror:        pgx.Identifier{"public", "dw_customers"},
		DeletedColumn: "deleted_at",
		LoadedColumn:  "loaded_at",
		RawPartition:  config.PartitionMonth,
		WriteTimeout:  2 * time.Minute,
	}
}

// TestConfigFrom: the Config built from the configuration file is the one
// its keys and defaults say.
func TestConfigFrom(t *testing.T) {
	e := &pollEnv{t: t, whDSN: "postgres://wh", srcDSN: "postgres://src"}
	got := pollConfig(t, e.config("time_zone: UTC\nlookback: 30m\nsafety_lag: 5s\nsoft_delete: gone"), "customers")
	want := literalConfig("postgres://src")
	want.TimeZone, want.Lookback, want.SafetyLag, want.SoftDelete = "UTC", 30*time.Minute, 5*time.Second, "gone"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFrom:\n got %+v\nwant %+v", got, want)
	}
	if _, err := poll.ConfigFrom(e.config(""), "other"); !errors.Is(err, poll.ErrSource) {
		t.Errorf("ConfigFrom of a source that is not configured: %v, want ErrSource", err)
	}
}

// TestConfigValidate: New refuses a Config it cannot work with, naming
// the field.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field  string
		change func(*poll.Config)
	}{
		{"Source", func(c *poll.Config) { c.Source = "" }},
		{"DSN", func(c *poll.Config) { c.DSN = "" }},
		{"Table", func(c *poll.Config) { c.Table = nil }},
		{"Table", func(c *poll.Config) { c.Table = pgx.Identifier{"public", ""} }},
		{"Key", func(c *poll.Config) { c.Key = nil }},
		{"UpdatedAt", func(c *poll.Config) { c.UpdatedAt = "" }},
		{"Lookback", func(c *poll.Config) { c.Lookback = -time.Second }},
		{"SafetyLag", func(c *poll.Config) { c.SafetyLag = -time.Second }},
		{"Every", func(c *poll.Config) { c.Every = 0 }},
		{"ChunkRows", func(c *poll.Config) { c.ChunkRows = 0 }},
		{"MaxRowsPerRun", func(c *poll.Config) { c.MaxRowsPerRun = 0 }},
		{"OutOfOrderness", func(c *poll.Config) { c.OutOfOrderness = -time.Second }},
		{"Mirror", func(c *poll.Config) { c.Mirror = pgx.Identifier{"a", "b", "c"} }},
		{"LoadedColumn", func(c *poll.Config) { c.LoadedColumn = c.DeletedColumn }},
		{"RawPartition", func(c *poll.Config) { c.RawPartition = "" }},
		{"WriteTimeout", func(c *poll.Config) { c.WriteTimeout = 0 }},
	} {
		c := literalConfig("postgres://src")
		tc.change(&c)
		_, err := poll.New(c, nil, poll.Options{})
		if !errors.Is(err, poll.ErrSource) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: New: %v, want ErrSource naming %s", tc.field, err, tc.field)
		}
	}
}

// TestPollFromLiteral: a poller built from a Config literal, without a
// configuration file, loads the source table into its mirror.
func TestPollFromLiteral(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers VALUES
		(1, 'ana@example.com', 'free', '2026-10-05 09:00+00'),
		(2, 'ben@example.com', 'pro',  '2026-10-05 09:30+00')`)
	c := literalConfig(e.srcDSN)
	c.ChunkRows = 1
	p, err := poll.New(c, e.wh, poll.Options{Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if rep := e.run(p, "2026-10-05 10:00", nil); rep.Inserted != 2 || rep.Chunks != 2 {
		t.Errorf("run inserted %d rows in %d chunks, want 2 in 2", rep.Inserted, rep.Chunks)
	}
	pgtest.Equal(t, "mirror", e.mirrorRows(), []string{
		"1 free 2026-10-05 09:00:00",
		"2 pro 2026-10-05 09:30:00",
	})
	if wm := e.watermark(); wm != "2026-10-05 09:30:00" {
		t.Errorf("watermark %s, want 2026-10-05 09:30:00", wm)
	}
}
