package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestCheck: tidemark check runs a CDC source's checks without changing
// anything and says how its slot fares in a failover: on the default
// server, that it has no failover slots, or, on PostgreSQL 17 with a
// standby, whether the slot is a failover slot, synchronized_standby_slots
// and the standby's copy; a problem (a table the source lacks) exits 1
// naming the key; --source naming no CDC source exits 2.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	primary := pgtest.NewServer(t, pgserver.Options{})
	srcDSN := pgtest.NewDatabaseOn(t, primary)
	src := pgtest.Pool(t, srcDSN)
	if _, err := src.Exec(ctx, `CREATE TABLE customers (id bigint PRIMARY KEY, name text)`); err != nil {
		t.Fatal(err)
	}
	var version int
	if err := src.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	whDSN := pgtest.NewDatabase(t)
	if _, err := migrate.Up(ctx, whDSN, nil); err != nil {
		t.Fatal(err)
	}
	standby := ""
	want := []string{"source shop", "slot tidemark_shop: does not exist", "has no failover slots", "  ok"}
	if version >= 170000 {
		// The standby keeps a synchronized_standby_slots, as a copy of
		// the primary's configuration would.
		sb := pgtest.NewStandby(t, primary, pgserver.StandbyOptions{Settings: map[string]string{"sync_replication_slots": "on",
			"synchronized_standby_slots": "standby9"}})
		// A failover slot, as the reader makes it, of no standby yet.
		if _, err := src.Exec(ctx, `SELECT pg_create_logical_replication_slot('tidemark_shop', 'pgoutput', false, false, true)`); err != nil {
			t.Fatal(err)
		}
		standby = fmt.Sprintf("      standby_dsn: %q\n", sb.URL("postgres"))
		want = []string{"source shop", "primary", "slot tidemark_shop: failover slot", "synchronized_standby_slots: (not set)",
			"failover: synchronized_standby_slots is not set", "standby: ",
			`failover: the standby's synchronized_standby_slots is "standby9"`, "  ok"}
	}
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  shop:
    cdc:
      dsn: %q
      tables: [customers]
%s    mirror: {schema: mirror}
`, whDSN, srcDSN, standby))
	code, stdout, stderr := invoke(t, "check", "-c", cfg)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stdout, w) {
			t.Errorf("the output lacks %q:\n%s", w, stdout)
		}
	}
	t.Logf("tidemark check:\n%s", stdout)

	// A new slot asked for: the slot is not held to the stored position.
	wh := pgtest.Pool(t, whDSN)
	if _, err := wh.Exec(ctx, `INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, applied_lsn, updated_at)
		VALUES ('shop', 'tidemark_shop', '1', 'resync', '0/16B3748', now())`); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := invoke(t, "check", "-c", cfg); code != exitOK || !strings.Contains(stdout, "new slot asked for (tidemark resync --new-slot)") {
		t.Errorf("a new slot asked for: exit %d, want 0 saying so:\n%s", code, stdout)
	}

	bad := writeFile(t, "bad.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  shop:
    cdc:
      dsn: %q
      tables: [customers, orders]
    mirror: {schema: mirror}
`, whDSN, srcDSN))
	code, stdout, _ = invoke(t, "check", "-c", bad)
	if code != exitFailure || !strings.Contains(stdout, "problem: ") || !strings.Contains(stdout, "sources.shop.cdc.tables: table public.orders does not exist") {
		t.Errorf("a missing table: exit %d, want 1 naming the key:\n%s", code, stdout)
	}
	if code, _, stderr = invoke(t, "check", "-c", cfg, "--source", "nope"); code != exitUsage || !strings.Contains(stderr, `"nope" is not a CDC source`) {
		t.Errorf("--source nope: exit %d, %s", code, stderr)
	}
	var slots int
	if err := src.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if wantSlots := map[bool]int{true: 1, false: 0}[version >= 170000]; slots != wantSlots {
		t.Errorf("check changed the source: %d slots, want %d", slots, wantSlots)
	}
}
