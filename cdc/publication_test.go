package cdc_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
)

// TestPublicationNameQuoted: a publication whose name holds a quote, a
// comma, a double quote and capitals (which configuration does not allow,
// but nothing below it may rely on that) is created under that name and
// streamed from.
func TestPublicationNameQuoted(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: soft")
	const name = `Tide'Pub, "x"`
	cfg.Sources["shop"].CDC.Publication = name
	e.start(cfg)
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00')`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	var n int64
	if err := e.src.QueryRow(e.ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", name).Scan(&n); err != nil || n != 1 {
		t.Errorf("publication %q: %d (%v)", name, n, err)
	}
}

// TestTableRemovedFromConfig: a table removed from cdc.tables stays in the
// publication the reader created, whose changes of it are then read and
// ignored: its mirror and raw change rows are kept as they were, the
// other tables go on, and the reader's start warns with the statement that
// drops the table from the publication.
func TestTableRemovedFromConfig(t *testing.T) {
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: hard")
	done, cancel := e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
	e.waitStreaming(done)
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00')`)
	e.waitMirrored("")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}
	rawBefore := e.count(`SELECT count(*) FROM raw.shop`)

	cfg.Sources["shop"].CDC.Tables = []string{"orders"}
	logs := &syncbuf.Buffer{}
	done, cancel = e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	}()
	e.waitStreaming(done)
	e.exec(`UPDATE customers SET tier = 'gold' WHERE id = 1; INSERT INTO customers VALUES (2, 'bo', 'free', NULL, NULL)`)
	e.exec(`INSERT INTO orders VALUES (2, 2, 1.00, '2026-10-05 10:00+00')`)
	e.wantCount("orders mirrored after the restart", 2, `SELECT count(*) FROM mirror.orders`)
	e.wantCount("raw change rows", rawBefore+1, `SELECT count(*) FROM raw.shop`)
	if got := pgtest.Rows(t, e.wh, `SELECT id::text || ' ' || tier FROM mirror.customers ORDER BY id`); strings.Join(got, ",") != "1 free" {
		t.Errorf("mirror.customers %q, want it as before the table was removed: [1 free]", got)
	}
	if !strings.Contains(logs.String(), `also publishes \"public\".\"customers\"`) || !strings.Contains(logs.String(), `DROP TABLE \"public\".\"customers\"`) {
		t.Errorf("the start did not warn of the table left in the publication:\n%s", logs.String())
	}
}
