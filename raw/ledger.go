package raw

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Ledger gathers the ledger rows of one load transaction: for each source
// and UTC hour of event time, how many rows the load wrote and their least
// and greatest event time. The zero Ledger is empty and ready for use; a
// Ledger is not safe for concurrent use.
type Ledger struct {
	hours map[ledgerKey]*ledgerHour
	// last is the entry of lastKey, the one Add counted into last: rows
	// come in runs of one source and hour, which then cost no map lookup.
	lastKey ledgerKey
	last    *ledgerHour
}

// ledgerKey is one source's UTC hour of event time (UnixHour).
type ledgerKey struct {
	source string
	hour   int64
}

// ledgerHour is what one ledger row holds.
type ledgerHour struct {
	rows     int64
	min, max time.Time
}

// Add counts one row of source with event time t. It is meant for the
// per-row loops of a write: integer hour arithmetic, and no map lookup
// while rows stay in the source and hour of the row before.
func (l *Ledger) Add(source string, t time.Time) {
	k := ledgerKey{source, UnixHour(t)}
	h := l.last
	if h == nil || k != l.lastKey {
		h = l.entry(k, t)
	}
	h.rows++
	if t.Before(h.min) {
		h.min = t
	}
	if t.After(h.max) {
		h.max = t
	}
}

// AddHour counts rows rows of source in the UTC hour that starts at hour,
// with event times from min to max: a count the warehouse made.
func (l *Ledger) AddHour(source string, hour time.Time, rows int64, min, max time.Time) {
	h := l.entry(ledgerKey{source, UnixHour(hour)}, min)
	h.rows += rows
	if min.Before(h.min) {
		h.min = min
	}
	if max.After(h.max) {
		h.max = max
	}
}

// entry returns the entry of k, created empty with both bounds at t if
// there is none, and makes it the last one.
func (l *Ledger) entry(k ledgerKey, t time.Time) *ledgerHour {
	h := l.hours[k]
	if h == nil {
		if l.hours == nil {
			l.hours = map[ledgerKey]*ledgerHour{}
		}
		h = &ledgerHour{min: t, max: t}
		l.hours[k] = h
	}
	l.lastKey, l.last = k, h
	return h
}

// Reset empties l, keeping its memory for the next load.
func (l *Ledger) Reset() {
	clear(l.hours)
	l.last = nil
}

// Len is the number of ledger rows l holds.
func (l *Ledger) Len() int { return len(l.hours) }

// Hours returns the start of each UTC hour in which l counts rows of
// source, in no particular order.
func (l *Ledger) Hours(source string) []time.Time {
	var out []time.Time
	for k := range l.hours {
		if k.source == source {
			out = append(out, hourStart(k.hour))
		}
	}
	return out
}

// Queue queues the insert of l's rows, with ingested_at ingestedAt, on qb
// and reports whether it did: an empty Ledger queues nothing.
func (l *Ledger) Queue(qb *pgx.Batch, ingestedAt time.Time) bool {
	if len(l.hours) == 0 {
		return false
	}
	qb.Queue(InsertLedgerSQL, l.args(ingestedAt)...)
	return true
}

// Write inserts l's rows, with ingested_at ingestedAt, in the load
// transaction tx; an empty Ledger writes nothing.
func (l *Ledger) Write(ctx context.Context, tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, ingestedAt time.Time) error {
	if len(l.hours) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, InsertLedgerSQL, l.args(ingestedAt)...); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	return nil
}

// args are InsertLedgerSQL's arguments for l's rows.
func (l *Ledger) args(ingestedAt time.Time) []any {
	n := len(l.hours)
	var (
		sources = make([]string, 0, n)
		hours   = make([]time.Time, 0, n)
		counts  = make([]int64, 0, n)
		mins    = make([]time.Time, 0, n)
		maxes   = make([]time.Time, 0, n)
	)
	for k, h := range l.hours {
		sources, hours, counts = append(sources, k.source), append(hours, hourStart(k.hour)), append(counts, h.rows)
		mins, maxes = append(mins, h.min), append(maxes, h.max)
	}
	return []any{ingestedAt, sources, hours, counts, mins, maxes}
}

// hourStart is the start of the UTC hour numbered h by UnixHour.
func hourStart(h int64) time.Time { return time.Unix(h*3600, 0).UTC() }
