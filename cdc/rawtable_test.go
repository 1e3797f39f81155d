package cdc_test

import (
	"testing"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/raw"
)

// TestRawTableOfOtherTypes: a raw change table created beforehand with
// other column types than tidemark's (commit_lsn as text here) gets its
// change rows as COPY text, which the server converts to those types,
// instead of in binary, which it would refuse.
func TestRawTableOfOtherTypes(t *testing.T) {
	e := newCDCEnv(t)
	conn, err := e.wh.Acquire(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = raw.NewChangeTable("shop", config.PartitionDay).Ensure(e.ctx, conn.Conn())
	conn.Release()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.wh.Exec(e.ctx, `ALTER TABLE raw.shop ALTER COLUMN commit_lsn TYPE text`); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("snapshot: never", "deletes: soft"))
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', '{"a": 1}', NULL), (2, 'ben', NULL, NULL, NULL)`)
	e.exec(`UPDATE customers SET tier = 'pro' WHERE id = 2`)
	e.exec(`DELETE FROM customers WHERE id = 1`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	pgtest.Equal(t, "raw change rows", pgtest.Lines(t, e.wh,
		`SELECT op, row_key, payload->>'tier', commit_lsn::pg_lsn > '0/0', event_id LIKE commit_lsn || '/%' FROM raw.shop ORDER BY commit_lsn::pg_lsn, event_id`),
		[]string{"insert | 1 | free | true | true", "insert | 2 | NULL | true | true", "update | 2 | pro | true | true", "delete | 1 | NULL | true | true"})
}
