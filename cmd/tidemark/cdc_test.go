package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// cdcConfig writes a configuration with one CDC source over the source
// database's table orders.
func cdcConfig(t *testing.T, whDSN, srcDSN string) string {
	t.Helper()
	return writeFile(t, "cdc.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms}
    mirror: {table: dw_orders}
`, whDSN, srcDSN))
}

// TestCDCSetupErrorStopsRun: a source table the mirror cannot follow makes
// `tidemark run` exit 1 with the reason, instead of retrying forever.
func TestCDCSetupErrorStopsRun(t *testing.T) {
	src, srcDSN := pgtest.NewPool(t)
	_, whDSN := pgtest.NewPool(t)
	if _, err := src.Exec(context.Background(), `CREATE TABLE orders (id bigint, amount numeric)`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := invoke(t, "run", "-c", cdcConfig(t, whDSN, srcDSN))
	if code != exitFailure || !strings.Contains(errOut, "orders") || !strings.Contains(errOut, "primary key") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 1 naming the table and its missing primary key", code, errOut)
	}
}

// TestCDCRunAndStatus runs the CDC component inside `tidemark run` and
// reads its position with `tidemark status`.
func TestCDCRunAndStatus(t *testing.T) {
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := src.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL);
		INSERT INTO orders SELECT i, i FROM generate_series(1, 100) AS i`); err != nil {
		t.Fatal(err)
	}
	cfg := cdcConfig(t, whDSN, srcDSN)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var out bytes.Buffer
	var errb syncbuf.Buffer // read while run writes it
	go func() { done <- run(runCtx, []string{"run", "--only", "cdc", "-c", cfg}, &out, &errb) }()
	defer func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("run exited %d:\n%s", code, errb.String())
		}
	}()
	// The snapshot's 100 rows, then a streamed change.
	rows := func(sql string, want int64) func() bool {
		return func() bool {
			var n int64
			return wh.QueryRow(ctx, sql).Scan(&n) == nil && n == want
		}
	}
	if waitfor.Poll(waitfor.Timeout, rows("SELECT count(*) FROM dw_orders", 100)) != nil {
		t.Fatalf("the snapshot did not arrive:\n%s", errb.String())
	}
	if _, err := src.Exec(ctx, `UPDATE orders SET amount = 0 WHERE id <= 10`); err != nil {
		t.Fatal(err)
	}
	if waitfor.Poll(waitfor.Timeout, rows("SELECT count(*) FROM dw_orders WHERE amount = 0", 10)) != nil {
		t.Fatalf("the update did not arrive:\n%s", errb.String())
	}
	code, stdout, stderr := invoke(t, "status", "-c", cfg)
	flat := strings.Join(strings.Fields(stdout), " ")
	for _, want := range []string{"source shop (cdc: slot tidemark_shop, orders)", "snapshot done", "transactions / changes 1 / 10"} {
		if code != exitOK || !strings.Contains(flat, want) {
			t.Errorf("status lacks %q (exit %d):\n%s%s", want, code, stdout, stderr)
		}
	}

	// A drift check of the CDC mirror: none, then a row the source does
	// not have. Applying deletes is left to the slot.
	code, stdout, stderr = invoke(t, "keys", "-c", cfg, "--source", "shop", "--dry-run")
	if code != exitOK || !strings.Contains(stdout, "shop public.orders: 0 missing at the source") {
		t.Errorf("keys --dry-run on a CDC source: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := wh.Exec(ctx, `INSERT INTO dw_orders (id, amount, loaded_at) VALUES (999, 1, now())`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = invoke(t, "keys", "-c", cfg, "--source", "shop", "--dry-run")
	if code != exitFailure || !strings.Contains(stdout, "shop public.orders: 1 missing at the source") {
		t.Errorf("keys --dry-run with drift: exit %d, want %d\n%s%s", code, exitFailure, stdout, stderr)
	}
	if code, _, stderr = invoke(t, "keys", "-c", cfg, "--source", "shop"); code != exitUsage || !strings.Contains(stderr, "is a CDC source") {
		t.Errorf("keys without --dry-run on a CDC source: exit %d, want %d\n%s", code, exitUsage, stderr)
	}
}
