package cdc_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
)

// literalConfig is the Config of the source shop of cdcEnv.config("", ""),
// written without a configuration file: the configuration's defaults,
// spelt out.
func literalConfig(srcDSN string) cdc.Config {
	return cdc.Config{
		Source:      "shop",
		DSN:         srcDSN,
		Publication: "tidemark_shop",
		Slot:        "tidemark_shop",
		Tables: []cdc.Table{
			{Source: pgx.Identifier{"public", "customers"}, Mirror: pgx.Identifier{"mirror", "customers"}},
			{Source: pgx.Identifier{"public", "orders"}, Mirror: pgx.Identifier{"mirror", "orders"}},
		},
		Snapshot:                 config.SnapshotInitial,
		SnapshotWorkers:          2,
		SnapshotChunkRows:        250000,
		ResyncChunkRows:          10000,
		ApplyTruncate:            true,
		HeartbeatEvery:           time.Minute,
		StatusEvery:              200 * time.Millisecond,
		MaxBufferBytes:           64 << 20,
		FailoverSlot:             config.FailoverAuto,
		DeletedColumn:            "deleted_at",
		LoadedColumn:             "loaded_at",
		RawPartition:             config.PartitionMonth,
		Distribute:               true,
		WriteTimeout:             2 * time.Minute,
		IdleInTransactionTimeout: 5 * time.Minute,
	}
}

// TestConfigFrom: the Config built from the configuration file is the one
// its keys and defaults say.
func TestConfigFrom(t *testing.T) {
	e := &cdcEnv{t: t, whDSN: "postgres://wh", srcDSN: "postgres://src"}
	if got, want := shopConfig(t, e.config("", "")), literalConfig("postgres://src"); !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFrom:\n got %+v\nwant %+v", got, want)
	}
	got := shopConfig(t, e.config("snapshot: never\ntruncate: ignore\nprimary_dsn: postgres://primary", "deletes: hard"))
	want := literalConfig("postgres://src")
	want.Snapshot, want.ApplyTruncate, want.PrimaryDSN, want.HardDeletes = config.SnapshotNever, false, "postgres://primary", true
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFrom:\n got %+v\nwant %+v", got, want)
	}
	if _, err := cdc.ConfigFrom(e.config("", ""), "other"); err == nil || !strings.Contains(err.Error(), `no CDC source is named "other"`) {
		t.Errorf("ConfigFrom of a source that is not configured: %v", err)
	}
}

// TestConfigValidate: New refuses a Config it cannot work with, naming
// the field.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field  string
		change func(*cdc.Config)
	}{
		{"Source", func(c *cdc.Config) { c.Source = "" }},
		{"DSN", func(c *cdc.Config) { c.DSN = "" }},
		{"Publication", func(c *cdc.Config) { c.Publication = "" }},
		{"Slot", func(c *cdc.Config) { c.Slot = "" }},
		{"Tables", func(c *cdc.Config) { c.Tables = nil }},
		{"Tables[1]", func(c *cdc.Config) { c.Tables[1].Mirror = pgx.Identifier{"orders"} }},
		{"Tables[1]", func(c *cdc.Config) { c.Tables[1].Source = c.Tables[0].Source }},
		{"Snapshot", func(c *cdc.Config) { c.Snapshot = "" }},
		{"SnapshotWorkers", func(c *cdc.Config) { c.SnapshotWorkers = 0 }},
		{"SnapshotChunkRows", func(c *cdc.Config) { c.SnapshotChunkRows = 0 }},
		{"ResyncChunkRows", func(c *cdc.Config) { c.ResyncChunkRows = 0 }},
		{"HeartbeatEvery", func(c *cdc.Config) { c.HeartbeatEvery = -time.Second }},
		{"StatusEvery", func(c *cdc.Config) { c.StatusEvery = 0 }},
		{"MaxBufferBytes", func(c *cdc.Config) { c.MaxBufferBytes = 0 }},
		{"FailoverSlot", func(c *cdc.Config) { c.FailoverSlot = "yes" }},
		{"DeletedColumn", func(c *cdc.Config) { c.DeletedColumn = "" }},
		{"RawPartition", func(c *cdc.Config) { c.RawPartition = "week" }},
		{"WriteTimeout", func(c *cdc.Config) { c.WriteTimeout = 0 }},
		{"IdleInTransactionTimeout", func(c *cdc.Config) { c.IdleInTransactionTimeout = -time.Second }},
	} {
		c := literalConfig("postgres://src")
		tc.change(&c)
		if _, err := cdc.New(c, nil, cdc.Options{}); err == nil || !strings.Contains(err.Error(), tc.field+" ") {
			t.Errorf("%s: New: %v, want an error naming %s", tc.field, err, tc.field)
		}
	}
	if _, err := cdc.New(literalConfig("postgres://src"), nil, cdc.Options{}); err != nil {
		t.Errorf("New: %v", err)
	}
}

// TestReaderFromLiteral: a reader built from a Config literal, without a
// configuration file, snapshots the tables and streams their changes into
// the mirrors.
func TestReaderFromLiteral(t *testing.T) {
	e := newCDCEnv(t)
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	c := literalConfig(e.srcDSN)
	c.Distribute = false // on a Citus warehouse too: the mirrors stay on the coordinator
	done, cancel := e.runConfig(c, cdc.Options{GroupAge: 20 * time.Millisecond, Registerer: e.reg})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
	e.waitStreaming(done)
	e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00')`)
	e.exec(`UPDATE customers SET tier = 'pro' WHERE id = 1`)
	e.waitMirrored("WHERE deleted_at IS NULL")
}
