package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestConfirmsOnlyDurableCommits: a warehouse that acknowledges commits
// before writing them (synchronous_commit = off) and then crashes loses
// nothing the slot was confirmed past. Without durable commits the crash
// takes the stored position (and the group that applied the change), the
// slot stays confirmed past it, and the next start refuses the slot.
func TestConfirmsOnlyDurableCommits(t *testing.T) {
	for _, tc := range []struct{ name, change string }{
		// The position is stored with the group that applies the change.
		{"applied change", `INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 10:00+00')`},
		// An idle reader stores the server's WAL end before confirming it.
		{"untracked write", `INSERT INTO untracked (note) VALUES ('moves WAL')`},
	} {
		t.Run(tc.name, func(t *testing.T) { confirmThenCrash(t, tc.change) })
	}
}

// confirmThenCrash makes change on the source, waits until the slot is
// confirmed past it, crashes the warehouse and starts a reader again,
// which must find the mirrors whole.
func confirmThenCrash(t *testing.T, change string) {
	t.Helper()
	// A test server runs with synchronous_commit = off; the WAL writer,
	// which would otherwise write asynchronous commits within 200 ms,
	// waits 10 s between rounds, so that the crash comes before it.
	srv := pgtest.NewServer(t, pgserver.Options{Settings: map[string]string{"wal_writer_delay": "10s"}})
	e := &cdcEnv{t: t, ctx: context.Background(), reg: prometheus.NewRegistry()}
	e.src, e.srcDSN = pgtest.NewPool(t)
	e.whDSN = pgtest.NewDatabaseOn(t, srv)
	e.wh = pgtest.Pool(t, e.whDSN)
	e.readers = pgtest.Pool(t, e.whDSN)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatal(err)
	}
	e.exec(shopDDL)
	var setting string
	if err := e.wh.QueryRow(e.ctx, "SHOW synchronous_commit").Scan(&setting); err != nil || setting != "off" {
		t.Fatalf("warehouse synchronous_commit = %q (%v), want off", setting, err)
	}
	cfg := e.config("", "")
	opts := cdc.Options{GroupAge: 20 * time.Millisecond}

	done, cancel := e.run(cfg, opts)
	e.waitStreaming(done)
	// Everything before the change is on disk: only the change's group is
	// at stake.
	if _, err := e.wh.Exec(e.ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	e.exec(change)
	var lsn string
	if err := e.src.QueryRow(e.ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		var past bool
		if err := e.src.QueryRow(e.ctx, "SELECT coalesce((SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'), false)", lsn).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	}); err != nil {
		t.Fatalf("the slot was not confirmed past the change (%s); it stands at %s", lsn, e.confirmed())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}

	if err := srv.Restart(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	e.wh = pgtest.Pool(t, e.whDSN)
	e.startWith(cfg, opts)
	e.waitMirrored("")
}
