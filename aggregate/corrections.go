package aggregate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// An event that no rebuild of its partition counts is recorded in
// tidemark.corrections, once per aggregate: one that arrived beyond the
// lateness horizon (the reconciler records it as it reads the load, and a
// rebuild records those its horizon leaves out that are not recorded
// yet), and any event of an archived partition, which nothing rebuilds.
// Under the arrival policy a recorded event is counted in the partition
// of the time it arrived, which is queued for a rebuild.

const (
	// recordBeyondSQL copies the events of partition [$3, $6) that match
	// the filter and arrived after $7 into tidemark.corrections, with the
	// whole raw row. %[1]s raw table, %[2]s event key expression, %[3]s
	// event time, %[4]s ingestion time, %[5]s the filter (on e).
	recordBeyondSQL = `
INSERT INTO tidemark.corrections (aggregate, policy, event_key, event_partition_start, arrival_partition_start,
                                  event_time, ingested_at, event, recorded_at, possible_duplicate)
SELECT $1, $2, %[2]s, $3, $4, e.%[3]s, e.%[4]s, to_jsonb(e.*), $5, $8
FROM %[1]s e
WHERE e.%[3]s >= $3 AND e.%[3]s < $6 AND e.%[4]s > $7 AND %[5]s
ON CONFLICT (aggregate, event_key) DO NOTHING`

	// arrivalsSQL lists the ingestion times of the events recordBeyondSQL
	// would record, to find the partitions they arrived in.
	arrivalsSQL = `
SELECT DISTINCT e.%[1]s FROM %[2]s e WHERE e.%[3]s >= $1 AND e.%[3]s < $2 AND e.%[1]s > $3 AND %[4]s`

	// queueArrivalSQL queues the partition counting recorded events under
	// the arrival policy (as the reconciler's claim queues partitions).
	// claimedSQL is how far the aggregate's claims have read: below a
	// transaction id (ledger sources), or up to an ingestion time (table
	// sources).
	claimedSQL = `SELECT load_xid::text, ingested_through FROM tidemark.load_watermarks WHERE aggregate = $1`

	queueArrivalSQL = `
INSERT INTO tidemark.pending_partitions AS q (aggregate, partition_start, partition_end, reason, queued_at)
VALUES ($1, $2, $3, 'arrival', $4)
ON CONFLICT (aggregate, partition_start) DO UPDATE SET queued_at = q.queued_at`
)

// eventKey identifies an event of the raw table (aliased e) in
// tidemark.corrections: its key columns as text, joined with |.
func (d *Definition) eventKey() string {
	parts := make([]string, len(d.EventKey))
	for i, k := range d.EventKey {
		parts[i] = "e." + pgquote.Ident(k) + "::text"
	}
	return "concat_ws('|', " + strings.Join(parts, ", ") + ")"
}

// Recording says which events of a partition RecordBeyond records.
type Recording struct {
	// Filter is a condition on the raw table, aliased e (true for all).
	Filter string
	// Archived records every event the filter selects, whatever its
	// arrival; the records are marked possible duplicates, since raw
	// rows of the partition are gone and an earlier copy of an event
	// among them cannot be ruled out. Otherwise only events that arrived
	// after the partition's horizon are recorded.
	Archived bool
}

// RecordBeyond records the events of partition p that r selects and that
// arrived in partition arrival (by their ingestion time), and returns how
// many it recorded: events recorded before are left as they are. Under the
// arrival policy the caller queues arrival when it recorded any.
func RecordBeyond(ctx context.Context, tx pgx.Tx, d *Definition, p, arrival Partition, r Recording, now time.Time) (int64, error) {
	after := any(d.HorizonEnd(p))
	if r.Archived {
		after = "-infinity"
	}
	sql := fmt.Sprintf(recordBeyondSQL, d.Raw.Sanitize(), d.eventKey(), pgquote.Ident(d.EventTime), pgquote.Ident(d.IngestedAt), r.Filter)
	tag, err := tx.Exec(ctx, sql, d.Name, d.Policy, p.Start, arrival.Start, now, p.End, after, r.Archived)
	if err != nil {
		return 0, fmt.Errorf("record events of %s %s in tidemark.corrections: %w", d.Name, p, err)
	}
	return tag.RowsAffected(), nil
}

// RecordBeyondByArrival is RecordBeyond for events that may have arrived
// in different partitions: it records them per partition they arrived
// in, and returns those that got new records.
func RecordBeyondByArrival(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, r Recording, now time.Time) (int64, []Partition, error) {
	after := any(d.HorizonEnd(p))
	if r.Archived {
		after = "-infinity"
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(arrivalsSQL, pgquote.Ident(d.IngestedAt), d.Raw.Sanitize(), pgquote.Ident(d.EventTime), r.Filter), p.Start, p.End, after)
	if err != nil {
		return 0, nil, fmt.Errorf("read the arrivals of events of %s %s: %w", d.Name, p, err)
	}
	arrivals := map[time.Time]Partition{}
	var order []time.Time
	var ia time.Time
	if _, err := pgx.ForEachRow(rows, []any{&ia}, func() error {
		if a := d.Of(ia); arrivals[a.Start].End.IsZero() {
			arrivals[a.Start] = a
			order = append(order, a.Start)
		}
		return nil
	}); err != nil {
		return 0, nil, fmt.Errorf("read the arrivals of events of %s %s: %w", d.Name, p, err)
	}
	var total int64
	var got []Partition
	for _, start := range order {
		a := arrivals[start]
		in := r
		in.Filter = fmt.Sprintf("(%s) AND e.%s >= %s AND e.%s < %s", r.Filter, pgquote.Ident(d.IngestedAt), timeLiteral(a.Start), pgquote.Ident(d.IngestedAt), timeLiteral(a.End))
		n, err := RecordBeyond(ctx, tx, d, p, a, in, now)
		if err != nil {
			return total, got, err
		}
		if n > 0 {
			total += n
			got = append(got, a)
		}
	}
	return total, got, nil
}

// recordExcluded records, inside a rebuild of p, the events of p that
// the rebuild leaves out because they arrived beyond the horizon and that
// the reconciler's claims have read but not recorded: those a claim queued p for under a longer horizon
// (the horizon was shortened since, or another instance runs another
// configuration) would otherwise be in no place at all. Events that
// arrived longer ago than the corrections are kept are left alone: their
// records may have been pruned, and recording them again would count them
// twice. Under the arrival policy it queues the partitions that count
// them.
func recordExcluded(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, now time.Time) (int64, error) {
	if d.Policy == RebuildAnyway {
		return 0, nil
	}
	// Only what the reconciler's claims have read: a claim still to come
	// records what it reads itself.
	var xid string
	var through pgtype.Timestamptz
	err := tx.QueryRow(ctx, claimedSQL, d.Name).Scan(&xid, &through)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("rebuild %s %s: read the load watermark: %w", d.Name, p, err)
	}
	filter := fmt.Sprintf("e.load_xid < '%s'::xid8", xid)
	if !d.Ledger {
		if !through.Valid || through.InfinityModifier != pgtype.Finite {
			return 0, nil
		}
		filter = fmt.Sprintf("e.%s <= %s", pgquote.Ident(d.IngestedAt), timeLiteral(through.Time))
	}
	if d.CorrectionsKept > 0 {
		filter += fmt.Sprintf(" AND e.%s > %s", pgquote.Ident(d.IngestedAt), timeLiteral(now.Add(-d.CorrectionsKept)))
	}
	n, arrivals, err := RecordBeyondByArrival(ctx, tx, d, p, Recording{Filter: filter}, now)
	if err != nil || d.Policy != Arrival {
		return n, err
	}
	for _, a := range arrivals {
		if _, err := tx.Exec(ctx, queueArrivalSQL, d.Name, a.Start, a.End, now); err != nil {
			return n, fmt.Errorf("rebuild %s %s: queue %s, which counts its events beyond the horizon: %w", d.Name, p, a, err)
		}
	}
	return n, nil
}
