package cdc_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// decodingOnStandby are the options of the tests that read a standby
// (PostgreSQL 16); withPrimary sets cdc.primary_dsn.
func decodingOnStandby(withPrimary bool) envOptions {
	return envOptions{needs: "decoding on a standby needs", major: 16, onStandby: true, withPrimary: withPrimary}
}

// TestDecodingOnStandby: on PostgreSQL 16 the reader creates its slot on
// a hot standby, takes the snapshot there and streams the primary's
// changes from it; with cdc.primary_dsn the publication is created on the
// primary and heartbeats are written there; the standby restarted, the
// reader reconnects; the standby promoted, the reader goes on from it. Without cdc.primary_dsn, a missing publication
// is a setup error that says what to run.
func TestDecodingOnStandby(t *testing.T) {
	pgtest.CitusIndependent(t)
	t.Run("with the primary", func(t *testing.T) {
		e := newFailoverEnv(t, decodingOnStandby(true))
		e.start(nil)
		e.waitMirrored()
		var onStandby bool
		if err := pgtest.Conn(t, e.standby.URL("postgres")).QueryRow(e.ctx,
			`SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = 'tidemark_shop')`).Scan(&onStandby); err != nil || !onStandby {
			t.Fatalf("the slot is not on the standby: %v", err)
		}
		var onPrimary bool
		if err := pgtest.Conn(t, e.primary.URL("postgres")).QueryRow(e.ctx,
			`SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = 'tidemark_shop')`).Scan(&onPrimary); err != nil || onPrimary {
			t.Fatalf("the primary has a slot of the reader: %v", err)
		}
		e.write(0, 30)
		e.waitMirrored()
		// The standby restarted mid-stream: the reader reconnects.
		if err := e.standby.Restart(e.ctx, false); err != nil {
			t.Fatal(err)
		}
		e.write(50, 20)
		e.waitMirrored()
		// Heartbeats through the primary move the slot while the tables
		// are quiet.
		before := e.confirmed()
		waitfor.Until(t, "heartbeats to move the slot past the last change", func() bool { return e.confirmed() > before })

		pgtest.Failover(t, e.primary, e.standby)
		e.srcDSN = e.readDSN
		e.write(100, 20)
		e.waitMirrored()
	})
	t.Run("without the primary", func(t *testing.T) {
		e := newFailoverEnv(t, decodingOnStandby(false))
		done, cancel := e.run(nil)
		defer cancel()
		select {
		case err := <-done:
			if !errors.Is(err, cdc.ErrSetup) || !strings.Contains(err.Error(), "sources.shop.cdc.primary_dsn") || !strings.Contains(err.Error(), "CREATE PUBLICATION") {
				t.Errorf("reader stopped with %v, want a setup error naming cdc.primary_dsn and the CREATE PUBLICATION to run", err)
			}
		case <-time.After(waitfor.Timeout):
			t.Fatal("the reader did not stop")
		}
	})
}

// TestDecodingOnStandbyRefused: a standby that cannot decode is refused,
// naming cdc.dsn: one older than PostgreSQL 16, or one without
// hot_standby_feedback, whose slot the primary's vacuum would invalidate.
func TestDecodingOnStandbyRefused(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	primary := pgtest.NewServer(t, pgserver.Options{})
	settings := map[string]string{}
	want := "which cannot decode changes (16 or later can)"
	if serverVersion(t, primary) >= 160000 {
		settings["hot_standby_feedback"] = "off"
		want = "without hot_standby_feedback"
	}
	dsn := pgtest.NewDatabaseOn(t, primary)
	standby := pgtest.NewStandby(t, primary, pgserver.StandbyOptions{Settings: settings})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config("", "")
	cfg.Sources["shop"].CDC.DSN = standby.URL(strings.TrimPrefix(u.Path, "/"))
	done, cancel := e.run(cfg, cdc.Options{})
	defer cancel()
	e.stopped(done, "sources.shop.cdc.dsn", want)
}
