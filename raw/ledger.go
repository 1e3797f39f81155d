package raw

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// loadedSinceSQL says whether a load transaction with an id at or above
// $4 wrote events of source $1 with event times in [$2, $3). A ledger
// row's bucket is the UTC hour of its event times, so the buckets that
// reach into the range start after $2 minus an hour; the load_xid index
// finds the few loads above the id.
const loadedSinceSQL = `
SELECT EXISTS (SELECT FROM tidemark.ingest_ledger
               WHERE load_xid >= $4::text::xid8 AND source = $1
                 AND bucket > $2::timestamptz - interval '1 hour' AND bucket < $3)`

// LoadedSince reports whether a load transaction with an id at or above
// xid (an xid8 in decimal) wrote events of source with event times in
// [from, to): whether what was built or read below xid misses some of
// that range. q is a connection or transaction, whose snapshot decides
// which loads have committed.
func LoadedSince(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, source string, from, to time.Time, xid string) (bool, error) {
	var loaded bool
	if err := q.QueryRow(ctx, loadedSinceSQL, source, from, to, xid).Scan(&loaded); err != nil {
		return false, fmt.Errorf("read the ledger of %s: %w", source, err)
	}
	return loaded, nil
}

// InsertLedgerSQL writes the ledger rows of one load transaction: $1
// ingested_at, then arrays of source, UTC hour, rows, min and max event
// time. Every source kind writes its ledger with it.
const InsertLedgerSQL = `
INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
SELECT u.source, pg_current_xact_id(), u.bucket, u.rows, u.min_event_time, u.max_event_time, $1
FROM unnest($2::text[], $3::timestamptz[], $4::bigint[], $5::timestamptz[], $6::timestamptz[])
     AS u (source, bucket, rows, min_event_time, max_event_time)`
