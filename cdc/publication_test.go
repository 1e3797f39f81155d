package cdc_test

import "testing"

// TestPublicationNameQuoted: a publication whose name holds a quote, a
// comma, a double quote and capitals (which configuration does not allow,
// but nothing below it may rely on that) is created under that name and
// streamed from.
func TestPublicationNameQuoted(t *testing.T) {
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
