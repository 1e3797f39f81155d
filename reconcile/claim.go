package reconcile

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

const (
	lockWatermarkSQL = `
SELECT load_xid::text, ingested_through FROM tidemark.load_watermarks WHERE aggregate = $1 FOR UPDATE`

	// snapshotXminSQL is the exact upper bound of a ledger window: every
	// transaction with a smaller id has finished, so the set of ledger rows
	// below it can never grow.
	snapshotXminSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`

	ledgerWindowSQL = `
SELECT load_xid::text, rows, min_event_time, max_event_time, ingested_at
FROM tidemark.ingest_ledger
WHERE source = $1 AND load_xid >= $2::xid8 AND load_xid < $3::xid8`

	// tableWindowSQL reads a timestamp-mode source table's window, per UTC
	// hour of event time. %[1]s table, %[2]s event time, %[3]s ingestion
	// time column.
	tableWindowSQL = `
SELECT min(%[2]s), max(%[2]s), min(%[3]s), max(%[3]s), count(*) FILTER (WHERE %[3]s > $3)
FROM %[1]s
WHERE %[3]s > $1 AND %[3]s <= $2
GROUP BY date_bin('1 hour', %[2]s, timestamptz '2000-01-01 00:00:00+00')`

	// queuePartitionsSQL queues partitions; one already queued keeps its
	// row as it is. The update changes nothing but takes the row's lock:
	// when another instance is rebuilding the partition (it holds the row
	// FOR UPDATE from picking it to its commit), the claim waits for that
	// rebuild to end, then finds the row deleted and inserts it again, so
	// the partition is rebuilt once more with the claimed data, which the
	// rebuild in progress may not have read. DO NOTHING would not wait, and
	// that rebuild would delete the row the claim counted on.
	queuePartitionsSQL = `
INSERT INTO tidemark.pending_partitions AS q (aggregate, partition_start, partition_end, reason, queued_at)
SELECT $1, u.s, u.e, u.r, $5 FROM unnest($2::timestamptz[], $3::timestamptz[], $4::text[]) AS u (s, e, r)
ORDER BY u.s
ON CONFLICT (aggregate, partition_start) DO UPDATE SET queued_at = q.queued_at`

	addArrivalsSQL = `
INSERT INTO tidemark.partition_arrivals AS a (aggregate, partition_start, age_seconds, rows)
SELECT $1, u.s, u.age, u.n FROM unnest($2::timestamptz[], $3::bigint[], $4::bigint[]) AS u (s, age, n)
ON CONFLICT (aggregate, partition_start, age_seconds) DO UPDATE SET rows = a.rows + EXCLUDED.rows`

	advanceWatermarkSQL = `
UPDATE tidemark.load_watermarks SET
    advanced_at = CASE WHEN $2::text::xid8 > load_xid OR ingested_through IS DISTINCT FROM $3::timestamptz
                       THEN $4 ELSE advanced_at END,
    load_xid = greatest(load_xid, $2::text::xid8),
    ingested_through = $3,
    last_run_at = $4,
    runs = runs + 1
WHERE aggregate = $1`
)

// window is what one claim read: per partition whether it must be rebuilt
// and which beyond-horizon events it had, plus counts for metrics.
type window struct {
	queue    map[time.Time]queued
	beyond   map[beyondKey]*loads // loads (ledger mode) of events to record
	arrivals map[arrivalKey]int64
	late     map[string]int64 // rows by lateness label
	recorded int64            // events recorded in tidemark.corrections
	rows     int64            // ledger rows or table rows read
	archived int64            // events read for archived partitions
	maxEvent time.Time
}

type queued struct {
	p      aggregate.Partition
	reason string
}

// beyondKey groups beyond-horizon events by their partition and the
// partition they arrived in.
type beyondKey struct {
	event, arrival time.Time
}

// loads are the load transactions of a window that wrote beyond-horizon
// events of one beyondKey, and the range of their ingestion times. A raw
// row carries its load's ingestion time, the same value as the load's
// ledger rows, so the range lets recordBeyond find the rows through the raw
// table's BRIN index on ingested_at.
type loads struct {
	xids     []string
	from, to time.Time
}

func (l *loads) add(xid string, ingestedAt time.Time) {
	if len(l.xids) == 0 || ingestedAt.Before(l.from) {
		l.from = ingestedAt
	}
	if len(l.xids) == 0 || ingestedAt.After(l.to) {
		l.to = ingestedAt
	}
	l.xids = append(l.xids, xid)
}

// filter selects the rows of the loads.
func (l *loads) filter(ingestedAt string) string {
	return fmt.Sprintf("e.load_xid = ANY('{%s}'::xid8[]) AND e.%s BETWEEN %s AND %s", strings.Join(dedupe(l.xids), ","),
		ingestedAt, timestamptzLiteral(pgtype.Timestamptz{Time: l.from, Valid: true}), timestamptzLiteral(pgtype.Timestamptz{Time: l.to, Valid: true}))
}

type arrivalKey struct {
	start time.Time
	age   int64
}

func newWindow() *window {
	return &window{queue: map[time.Time]queued{}, beyond: map[beyondKey]*loads{},
		arrivals: map[arrivalKey]int64{}, late: map[string]int64{}}
}

func (w *window) add(p aggregate.Partition, reason string) {
	if _, ok := w.queue[p.Start]; !ok || reason == "late" {
		w.queue[p.Start] = queued{p, reason}
	}
}

// ageStep rounds an age up to the arrival-history grid: 15 minutes within
// two days of a partition's end, hours within a month, days beyond.
func ageStep(age time.Duration) int64 {
	s := age.Seconds()
	step := 900.0
	switch a := math.Abs(s); {
	case a > 31*86400:
		step = 86400
	case a > 2*86400:
		step = 3600
	}
	return int64(math.Ceil(s/step) * step)
}

// account files n events of partition p ingested at ingestedAt, deciding
// whether p must be rebuilt or the events lie beyond its horizon. Events of
// an archived partition are beyond it under every policy: the partition
// cannot be rebuilt.
func (w *window) account(d *aggregate.Definition, p aggregate.Partition, ingestedAt time.Time, n int64, first, archived bool, beyond func()) {
	age := ingestedAt.Sub(p.End)
	within := !archived && (d.Policy == aggregate.RebuildAnyway || !ingestedAt.After(d.HorizonEnd(p)))
	if first {
		// Counts go to the first partition of a bucket that spans two.
		w.late[latenessLabel(age.Seconds())] += n
		if within {
			w.arrivals[arrivalKey{p.Start, ageStep(age)}] += n
		}
	}
	if within {
		reason := "new"
		if age > 0 {
			reason = "late"
		}
		w.add(p, reason)
		return
	}
	beyond()
}

// claimLedger reads the ledger between the stored load watermark and the
// snapshot's xmin, and in the same transaction queues the partitions to
// rebuild, records beyond-horizon events and advances the watermark.
func (r *Reconciler) claimLedger(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, now time.Time) (*window, string, error) {
	var lo string
	var through pgtype.Timestamptz
	if err := tx.QueryRow(ctx, lockWatermarkSQL, d.Name).Scan(&lo, &through); err != nil {
		return nil, "", fmt.Errorf("lock load watermark: %w", err)
	}
	var hi string
	if err := tx.QueryRow(ctx, snapshotXminSQL).Scan(&hi); err != nil {
		return nil, "", fmt.Errorf("read snapshot: %w", err)
	}
	// On Citus, a load below the bound may still be prepared on a
	// worker: a rebuild would miss its rows there while the bound moves
	// past it for good.
	if err := d.AwaitWorkers(ctx, tx); err != nil {
		return nil, "", err
	}
	retained, err := aggregate.RetainedFrom(ctx, tx, d.Source)
	if err != nil {
		return nil, "", err
	}
	w := newWindow()
	rows, err := tx.Query(ctx, ledgerWindowSQL, d.Source, lo, hi)
	if err != nil {
		return nil, "", fmt.Errorf("read ledger: %w", err)
	}
	for rows.Next() {
		var xid string
		var n int64
		var minT, maxT, ingestedAt time.Time
		if err := rows.Scan(&xid, &n, &minT, &maxT, &ingestedAt); err != nil {
			rows.Close()
			return nil, "", fmt.Errorf("read ledger: %w", err)
		}
		w.rows++
		if maxT.After(w.maxEvent) {
			w.maxEvent = maxT
		}
		arrival := d.Of(ingestedAt).Start
		for i, p := range d.Calendar.Overlapping(minT, maxT) {
			k := beyondKey{p.Start, arrival}
			archived := aggregate.ArchivedBefore(p, retained)
			if archived {
				w.archived += n
			}
			w.account(d, p, ingestedAt, n, i == 0, archived, func() {
				if w.beyond[k] == nil {
					w.beyond[k] = &loads{}
				}
				w.beyond[k].add(xid, ingestedAt)
			})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("read ledger: %w", err)
	}
	for k, l := range w.beyond {
		rec := aggregate.Recording{Filter: l.filter(pgquote.Ident(d.IngestedAt)), Archived: aggregate.ArchivedBefore(d.Calendar.At(k.event), retained)}
		if err := r.recordBeyond(ctx, tx, d, k, rec, now, w); err != nil {
			return nil, "", err
		}
	}
	if w.archived > 0 {
		// Under the rebuild policy too: an archived partition's raw rows
		// are gone, so a rebuild would lose the published rows.
		r.log.Warn("events arrived for archived partitions; recorded in tidemark.corrections, the partitions stay as published",
			"aggregate", d.Name, "events", w.archived, "beyond_horizon", d.Policy, "raw_retained_from", retained.UTC().Format(time.RFC3339))
	}
	if err := r.finishClaim(ctx, tx, d, w, hi, through, now); err != nil {
		return nil, "", err
	}
	return w, hi, nil
}

// claimTable is claimLedger for a timestamp-mode source: the window is
// (watermark - lookback, now() - safety_lag] of the ingestion-time column,
// and the watermark advances to the newest ingestion time read, never to
// now(). Rows read again through the lookback only rebuild their
// partitions again, which is idempotent.
func (r *Reconciler) claimTable(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, ts *config.TableSource, now time.Time) (*window, time.Time, error) {
	var lo string
	var through pgtype.Timestamptz
	if err := tx.QueryRow(ctx, lockWatermarkSQL, d.Name).Scan(&lo, &through); err != nil {
		return nil, time.Time{}, fmt.Errorf("lock load watermark: %w", err)
	}
	var upper time.Time
	if err := tx.QueryRow(ctx, "SELECT statement_timestamp() - $1::interval", ts.SafetyLag.Duration().String()).Scan(&upper); err != nil {
		return nil, time.Time{}, fmt.Errorf("read clock: %w", err)
	}
	wm := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	low := wm
	if through.Valid {
		wm = through
		low = pgtype.Timestamptz{Time: through.Time.Add(-ts.Lookback.Duration()), Valid: true}
	}
	w := newWindow()
	sql := fmt.Sprintf(tableWindowSQL, d.Raw.Sanitize(), pgquote.Ident(d.EventTime), pgquote.Ident(d.IngestedAt))
	rows, err := tx.Query(ctx, sql, low, upper, wm)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read %s: %w", d.Raw.Sanitize(), err)
	}
	newest := wm
	type group struct {
		minT, maxT, minIA, maxIA time.Time
		fresh                    int64
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.minT, &g.maxT, &g.minIA, &g.maxIA, &g.fresh); err != nil {
			rows.Close()
			return nil, time.Time{}, fmt.Errorf("read %s: %w", d.Raw.Sanitize(), err)
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("read %s: %w", d.Raw.Sanitize(), err)
	}
	beyond := map[time.Time]bool{}
	for _, g := range groups {
		w.rows += g.fresh
		if g.maxT.After(w.maxEvent) {
			w.maxEvent = g.maxT
		}
		if newest.InfinityModifier != pgtype.Finite || g.maxIA.After(newest.Time) {
			newest = pgtype.Timestamptz{Time: g.maxIA, Valid: true}
		}
		for i, p := range d.Calendar.Overlapping(g.minT, g.maxT) {
			// Rows of one group may lie on both sides of the horizon:
			// rebuild if the earliest was within, record if the latest was
			// beyond. Counts use the latest ingestion time of new rows.
			w.account(d, p, g.minIA, 0, false, false, func() {})
			if i == 0 && g.fresh > 0 {
				w.account(d, p, g.maxIA, g.fresh, true, false, func() {})
			}
			if d.Policy != aggregate.RebuildAnyway && g.maxIA.After(d.HorizonEnd(p)) {
				beyond[p.Start] = true
			}
		}
	}
	for start := range beyond {
		p := d.Calendar.At(start)
		filter := fmt.Sprintf("e.%[1]s > %[2]s AND e.%[1]s <= %[3]s", pgquote.Ident(d.IngestedAt), timestamptzLiteral(low), timestamptzLiteral(pgtype.Timestamptz{Time: upper, Valid: true}))
		// The arrival partition depends on each row's ingestion time:
		// record per arrival partition that the window can reach.
		n, arrivals, err := aggregate.RecordBeyondByArrival(ctx, tx, d, p, aggregate.Recording{Filter: filter}, now)
		if err != nil {
			return nil, time.Time{}, err
		}
		w.recorded += n
		if d.Policy == aggregate.Arrival {
			for _, a := range arrivals {
				w.add(a, "arrival")
			}
		}
	}
	var watermark time.Time
	if newest.InfinityModifier == pgtype.Finite {
		watermark = newest.Time
	}
	if err := r.finishClaim(ctx, tx, d, w, "0", newest, now); err != nil {
		return nil, time.Time{}, err
	}
	return w, watermark, nil
}

func timestamptzLiteral(t pgtype.Timestamptz) string {
	switch t.InfinityModifier {
	case pgtype.NegativeInfinity:
		return "'-infinity'::timestamptz"
	case pgtype.Infinity:
		return "'infinity'::timestamptz"
	}
	return "'" + t.Time.UTC().Format("2006-01-02 15:04:05.999999") + "+00'::timestamptz"
}

// recordBeyond records the events of partition k.event that arrived in
// partition k.arrival and rec selects (see aggregate.RecordBeyond),
// counts them in w, and under the arrival policy queues k.arrival.
func (r *Reconciler) recordBeyond(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, k beyondKey, rec aggregate.Recording, now time.Time, w *window) error {
	n, err := aggregate.RecordBeyond(ctx, tx, d, d.Calendar.At(k.event), d.Calendar.At(k.arrival), rec, now)
	if err != nil {
		return err
	}
	w.recorded += n
	if d.Policy == aggregate.Arrival && n > 0 {
		w.add(d.Calendar.At(k.arrival), "arrival")
	}
	return nil
}

// finishClaim queues the window's partitions, adds its arrival history and
// advances the load watermark, all in the claim's transaction.
func (r *Reconciler) finishClaim(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, w *window, hi string, through pgtype.Timestamptz, now time.Time) error {
	if len(w.queue) > 0 {
		var starts, ends []time.Time
		var reasons []string
		for _, q := range w.queue {
			starts, ends, reasons = append(starts, q.p.Start), append(ends, q.p.End), append(reasons, q.reason)
		}
		if _, err := tx.Exec(ctx, queuePartitionsSQL, d.Name, starts, ends, reasons, now); err != nil {
			return fmt.Errorf("queue partitions: %w", err)
		}
	}
	if len(w.arrivals) > 0 {
		keys := make([]arrivalKey, 0, len(w.arrivals))
		for k := range w.arrivals {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			if !keys[i].start.Equal(keys[j].start) {
				return keys[i].start.Before(keys[j].start)
			}
			return keys[i].age < keys[j].age
		})
		starts, ages, counts := make([]time.Time, len(keys)), make([]int64, len(keys)), make([]int64, len(keys))
		for i, k := range keys {
			starts[i], ages[i], counts[i] = k.start, k.age, w.arrivals[k]
		}
		if _, err := tx.Exec(ctx, addArrivalsSQL, d.Name, starts, ages, counts); err != nil {
			return fmt.Errorf("record arrivals: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, advanceWatermarkSQL, d.Name, hi, through, now); err != nil {
		return fmt.Errorf("advance load watermark: %w", err)
	}
	return nil
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
