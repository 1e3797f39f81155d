package backfill

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
)

// Reprocess says which chunks of the range a run rebuilds.
type Reprocess string

// Reprocess behaviours.
const (
	// Missing rebuilds the chunks holding a partition that was never
	// built (by the reconciler or a backfill).
	Missing Reprocess = "missing"
	// Failed rebuilds those, and the chunks holding a partition whose
	// last backfill chunk did not finish (it failed, or its run was
	// interrupted).
	Failed Reprocess = "failed"
	// Completed rebuilds every chunk: what a fix of the aggregate's logic
	// needs.
	Completed Reprocess = "completed"
)

// ParseReprocess reads a --reprocess value.
func ParseReprocess(s string) (Reprocess, error) {
	switch r := Reprocess(s); r {
	case Missing, Failed, Completed:
		return r, nil
	}
	return "", fmt.Errorf("%q is not a reprocess behaviour (missing, failed or completed)", s)
}

// Chunk is a run of whole partitions: the unit a backfill plans, retries
// and records.
type Chunk struct {
	Start, End time.Time
	Partitions []aggregate.Partition
	// Run says whether the run rebuilds the chunk; Reason says why, or
	// why not.
	Run    bool
	Reason string
	// Archived counts the chunk's archived partitions: retention dropped
	// raw rows they were built from.
	Archived int

	forced       bool // Run, were it not for the archived partitions
	forcedReason string
}

// Label names the chunk for people: its first and last partition.
func (c Chunk) Label() string {
	first, last := c.Partitions[0].Label(), c.Partitions[len(c.Partitions)-1].Label()
	if first == last {
		return first
	}
	return first + " .. " + last
}

// Range is the days to cover, in the aggregate's time zone: every
// partition holding an instant of [From, To + 1 day).
type Range struct {
	From, To time.Time
}

// bounds are the instants of the range in the calendar's zone.
func (r Range) bounds(c aggregate.Calendar) (time.Time, time.Time) {
	day := func(t time.Time) time.Time { return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, c.Loc) }
	return day(r.From), day(r.To).AddDate(0, 0, 1)
}

// chunks groups the partitions of the range into chunks spanning at most
// span each (whole days of the zone when span is a number of days), with
// at least one partition each.
func chunks(d *aggregate.Definition, r Range, span time.Duration) []Chunk {
	lo, hi := r.bounds(d.Calendar)
	if !hi.After(lo) {
		return nil
	}
	var out []Chunk
	for _, p := range d.Calendar.Overlapping(lo, hi.Add(-time.Nanosecond)) {
		if n := len(out); n > 0 && !p.End.After(limit(out[n-1].Start, span, d.Calendar.Loc)) {
			out[n-1].Partitions = append(out[n-1].Partitions, p)
			out[n-1].End = p.End
			continue
		}
		out = append(out, Chunk{Start: p.Start, End: p.End, Partitions: []aggregate.Partition{p}})
	}
	return out
}

// limit is the end of a chunk that starts at start: calendar days in loc
// for a whole number of days (so that a chunk of 1d holds one day across
// a DST change), the plain duration otherwise.
func limit(start time.Time, span time.Duration, loc *time.Location) time.Time {
	if span%(24*time.Hour) == 0 {
		return start.In(loc).AddDate(0, 0, int(span/(24*time.Hour)))
	}
	return start.Add(span)
}

const (
	// builtSQL lists the partitions of an aggregate that have been built.
	builtSQL = `
SELECT partition_start FROM tidemark.partitions
WHERE aggregate = $1 AND partition_start >= $2 AND partition_start < $3`

	// chunkHistorySQL lists the chunks of earlier runs that overlap a
	// range, oldest run first, so that a later run's outcome wins. Shadow
	// runs publish nothing and do not count.
	chunkHistorySQL = `
SELECT c.chunk_start, c.chunk_end, c.status FROM tidemark.backfill_chunks c
JOIN tidemark.backfill_runs r ON r.id = c.run_id
WHERE r.aggregate = $1 AND r.kind <> 'shadow' AND c.chunk_end > $2 AND c.chunk_start < $3
ORDER BY r.id`
)

// Plan lists the chunks of the range and whether a run with reprocess
// would rebuild each. A chunk holding an archived partition is not run
// (see Options.Force).
func Plan(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, span time.Duration, reprocess Reprocess) ([]Chunk, error) {
	cs := chunks(d, r, span)
	if len(cs) == 0 {
		return nil, nil
	}
	retained, err := aggregate.RetainedFrom(ctx, pool, d.Source)
	if err != nil {
		return nil, fmt.Errorf("backfill %s: %w", d.Name, err)
	}
	lo, hi := cs[0].Start, cs[len(cs)-1].End
	rows, err := pool.Query(ctx, builtSQL, d.Name, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("backfill %s: read partitions: %w", d.Name, err)
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, fmt.Errorf("backfill %s: read partitions: %w", d.Name, err)
	}
	built := map[int64]bool{}
	for _, s := range starts {
		built[s.UnixMicro()] = true
	}
	var planned []int64 // partition starts, ascending
	for _, c := range cs {
		for _, p := range c.Partitions {
			planned = append(planned, p.Start.UnixMicro())
		}
	}
	last := map[int64]string{} // partition start → status of its latest chunk
	rows, err = pool.Query(ctx, chunkHistorySQL, d.Name, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("backfill %s: read earlier runs: %w", d.Name, err)
	}
	var cStart, cEnd time.Time
	var status string
	_, err = pgx.ForEachRow(rows, []any{&cStart, &cEnd, &status}, func() error {
		end := cEnd.UnixMicro()
		for i := sort.Search(len(planned), func(i int) bool { return planned[i] >= cStart.UnixMicro() }); i < len(planned) && planned[i] < end; i++ {
			last[planned[i]] = status
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backfill %s: read earlier runs: %w", d.Name, err)
	}
	for i := range cs {
		c := &cs[i]
		var never, unfinished int
		for _, p := range c.Partitions {
			k := p.Start.UnixMicro()
			if aggregate.ArchivedBefore(p, retained) {
				c.Archived++
			}
			if !built[k] {
				never++
			} else if s, ok := last[k]; ok && s != "done" {
				unfinished++
			}
		}
		switch {
		case never > 0:
			c.Run, c.Reason = true, fmt.Sprintf("%d of %d partitions never built", never, len(c.Partitions))
		case unfinished > 0 && reprocess != Missing:
			c.Run, c.Reason = true, fmt.Sprintf("%d of %d partitions' last backfill did not finish", unfinished, len(c.Partitions))
		case reprocess == Completed:
			c.Run, c.Reason = true, "built; --reprocess completed"
		case unfinished > 0:
			c.Reason = "built, but its last backfill did not finish (--reprocess failed rebuilds it)"
		default:
			c.Reason = "built (--reprocess completed rebuilds it)"
		}
		if c.Archived > 0 {
			c.forced, c.forcedReason = c.Run, c.Reason
			c.Run = false
			c.Reason = fmt.Sprintf("%d of %d partitions archived: raw rows before %s were dropped by retention (--force rebuilds them from what is left)",
				c.Archived, len(c.Partitions), retained.In(d.Calendar.Loc).Format(time.DateOnly))
		}
	}
	return cs, nil
}

// force makes the chunk's decision the one it would be without its
// archived partitions.
func (c *Chunk) force() {
	if c.Archived > 0 {
		c.Run, c.Reason = c.forced, c.forcedReason
		if c.forced {
			c.Reason += "; archived, rebuilt with --force"
		}
	}
}
