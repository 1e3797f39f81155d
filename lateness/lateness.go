// Package lateness measures how late a source's events arrive, from the
// warehouse alone: the delay of each raw row's ingestion time after its
// event time, and, for each aggregate over the source, after the end of
// the event's partition in the aggregate's calendar — the delay the
// lateness horizon is compared with. From the second it finds the smallest
// horizon that would have kept a target share of events, and it reads the
// arrival curve behind the completeness estimate: the share of a final
// partition's rows that had arrived at each age.
//
// `tidemark lateness` prints a Report; the status page draws one as a
// chart per aggregate next to the arrival curve.
package lateness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// Querier reads from the warehouse.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Quantiles the reports give, besides the target.
var Quantiles = []float64{0.5, 0.9, 0.99, 0.999}

// Options say what to measure.
type Options struct {
	// Since and Until bound the event times measured: [Since, Until).
	Since, Until time.Time
	// Target is the share of events a recommended horizon must keep, in
	// (0, 1]; 0 means DefaultTarget.
	Target float64
	// MaxRows, when positive, measures a sample of about that many rows
	// (TABLESAMPLE SYSTEM) when the planner estimates more in range; the
	// status page uses it to stay cheap. 0 measures every row.
	MaxRows int64
}

// DefaultTarget is the share of events a recommended horizon keeps unless
// told otherwise.
const DefaultTarget = 0.999

// Report is the lateness of one source.
type Report struct {
	Source string    `json:"source"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	Target float64   `json:"target"`
	// SamplePercent is the share of the raw table's blocks read, in
	// percent; 100 when every row was measured.
	SamplePercent float64 `json:"sample_percent"`
	// Delay is ingested_at − event_time.
	Delay Distribution `json:"delay"`
	// Aggregates hold the delay after the partition's end, per aggregate
	// over the source.
	Aggregates []Aggregate `json:"aggregates"`
}

// Distribution summarises delays in seconds.
type Distribution struct {
	Events int64 `json:"events"`
	// Quantiles holds the delay at each of Quantiles, in seconds: the
	// smallest delay at or below which that share of events arrived.
	Quantiles []float64 `json:"quantiles_seconds"`
	Min       float64   `json:"min_seconds"`
	Max       float64   `json:"max_seconds"`
	// Bins count events by delay: Bins[0] those with delay <= Edges[0],
	// Bins[i] those with Edges[i-1] < delay <= Edges[i], and the last those
	// beyond the last edge.
	Edges []float64 `json:"bin_edges_seconds"`
	Bins  []int64   `json:"bins"`
}

// Quantile returns the delay at share q of Quantiles.
func (d Distribution) Quantile(q float64) (time.Duration, bool) {
	i := slices.Index(Quantiles, q)
	if i < 0 || i >= len(d.Quantiles) {
		return 0, false
	}
	return seconds(d.Quantiles[i]), true
}

// Aggregate is the delay of a source's events after the end of their
// partition in one aggregate's calendar.
type Aggregate struct {
	Name     string        `json:"aggregate"`
	Calendar string        `json:"calendar"` // e.g. "day in UTC"
	Horizon  time.Duration `json:"lateness_horizon_ns"`
	PastEnd  Distribution  `json:"delay_after_partition_end"`
	// Beyond counts the events that arrived after their partition's
	// horizon; Kept is the share that did not.
	Beyond int64   `json:"beyond_horizon"`
	Kept   float64 `json:"kept"`
	// Recommended is the smallest horizon that would have kept Target of
	// the events: the Target quantile of the delay after the partition's
	// end, or 0 when that arrived before the end. Suggested rounds it up
	// to a value for the configuration.
	Recommended time.Duration `json:"recommended_horizon_ns"`
	Suggested   string        `json:"suggested_lateness_horizon"`
}

// Edges are the delay bins' upper bounds in seconds: before the end (or
// the event), then 15 minutes, 1, 3, 6 and 12 hours, 1, 2, 3, 7, 14 and 30
// days.
var Edges = []float64{0, 900, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 3 * 86400, 7 * 86400, 14 * 86400, 30 * 86400}

// delaySQL measures the delays of one raw table: %[1]s the table aliased
// r (with a sample clause), %[2]s the delay expression in seconds, %[3]s
// the event time column, %[4]s the ingestion time column (rows without
// one have no delay and are left out). $1, $2 bound event times, $3 holds
// the bin edges negated in reverse order, so that width_bucket's
// lower-inclusive buckets become the upper-inclusive bins of
// Distribution, $4 the quantiles. The delays are read once and sorted
// once; the bins are counted from the same rows.
const delaySQL = `
WITH d AS MATERIALIZED (
    SELECT %[2]s AS delay FROM %[1]s WHERE r.%[3]s >= $1 AND r.%[3]s < $2 AND r.%[4]s IS NOT NULL
), b AS (
    SELECT width_bucket(-delay, $3::float8[]) AS bucket, count(*) AS n FROM d GROUP BY 1
)
SELECT t.n, t.q, t.lo, t.hi, coalesce(b.buckets, '{}'), coalesce(b.counts, '{}')
FROM (SELECT count(*) AS n, percentile_disc($4::float8[]) WITHIN GROUP (ORDER BY delay) AS q, min(delay) AS lo, max(delay) AS hi FROM d) t,
     (SELECT array_agg(bucket ORDER BY bucket) AS buckets, array_agg(n ORDER BY bucket) AS counts FROM b) b`

// estimateSQL asks the planner how many rows of a table have event times
// in [$1, $2): %[1]s the table, %[2]s the event time column.
const estimateSQL = `EXPLAIN (FORMAT JSON) SELECT 1 FROM %[1]s WHERE %[2]s >= $1 AND %[2]s < $2`

// sampleSeed makes every scan of one measurement read the same sample.
const sampleSeed = 20261005

// Measure reports the lateness of source over [o.Since, o.Until).
func Measure(ctx context.Context, q Querier, cfg *config.Config, source string, o Options) (*Report, error) {
	sc := cfg.Sources[source]
	if sc == nil {
		return nil, fmt.Errorf("lateness: no source named %q", source)
	}
	if o.Target == 0 {
		o.Target = DefaultTarget
	}
	if o.Target <= 0 || o.Target > 1 {
		return nil, fmt.Errorf("lateness: target %v is not a share in (0, 1]", o.Target)
	}
	if !o.Since.Before(o.Until) {
		return nil, fmt.Errorf("lateness: empty range %s .. %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	raw := aggregate.RawOf(source, sc)
	r := &Report{Source: source, Since: o.Since.UTC(), Until: o.Until.UTC(), Target: o.Target, SamplePercent: 100}
	et, ia := pgquote.Ident(raw.EventTime), pgquote.Ident(raw.IngestedAt)
	from := raw.Table.Sanitize() + " r"
	if o.MaxRows > 0 {
		est, err := estimate(ctx, q, fmt.Sprintf(estimateSQL, raw.Table.Sanitize(), et), r.Since, r.Until)
		if err != nil {
			return nil, fmt.Errorf("lateness %s: estimate rows: %w", source, err)
		}
		if est > float64(o.MaxRows) {
			r.SamplePercent = math.Max(0.01, 100*float64(o.MaxRows)/est)
			from += fmt.Sprintf(" TABLESAMPLE SYSTEM (%g) REPEATABLE (%d)", r.SamplePercent, sampleSeed)
		}
	}
	delay := fmt.Sprintf("extract(epoch FROM r.%s - r.%s)::float8", ia, et)
	var err error
	if r.Delay, _, err = measure(ctx, q, fmt.Sprintf(delaySQL, from, delay, et, ia), r.Since, r.Until, Edges, Quantiles); err != nil {
		return nil, fmt.Errorf("lateness %s: %w", source, err)
	}
	// The delay after the partition's end depends on the calendar only:
	// measure it once per calendar, with every horizon among the edges.
	type calendar struct {
		cal  aggregate.Calendar
		aggs []int // indices in r.Aggregates
	}
	var cals []*calendar
	byName := map[string]*calendar{}
	for _, name := range cfg.AggregateNames() {
		a := cfg.Aggregates[name]
		if a.Source != source {
			continue
		}
		d, err := aggregate.FromConfig(cfg, name)
		if err != nil {
			return nil, err
		}
		key := a.Partition.By + " in " + a.Partition.TimeZone
		c := byName[key]
		if c == nil {
			c = &calendar{cal: d.Calendar}
			byName[key] = c
			cals = append(cals, c)
		}
		r.Aggregates = append(r.Aggregates, Aggregate{Name: name, Calendar: key, Horizon: d.Horizon})
		c.aggs = append(c.aggs, len(r.Aggregates)-1)
	}
	pastEnd := fmt.Sprintf("extract(epoch FROM r.%s - ($5::timestamptz[])[width_bucket(r.%s, $5::timestamptz[]) + 1])::float8", ia, et)
	for _, c := range cals {
		edges := Edges
		for _, i := range c.aggs {
			edges = withEdge(edges, r.Aggregates[i].Horizon.Seconds())
		}
		dist, targetQ, err := measure(ctx, q, fmt.Sprintf(delaySQL, from, pastEnd, et, ia), r.Since, r.Until, edges,
			append(slices.Clone(Quantiles), o.Target), Bounds(c.cal, r.Since, r.Until))
		if err != nil {
			return nil, fmt.Errorf("lateness %s, %s: %w", source, r.Aggregates[c.aggs[0]].Calendar, err)
		}
		for _, i := range c.aggs {
			a := &r.Aggregates[i]
			a.PastEnd = dist
			a.Beyond = dist.Beyond(a.Horizon.Seconds())
			if dist.Events > 0 {
				a.Kept = 1 - float64(a.Beyond)/float64(dist.Events)
				// Rounded up: a horizon a nanosecond short of the
				// quantile would not keep it.
				a.Recommended = time.Duration(math.Ceil(math.Max(0, targetQ) * float64(time.Second)))
				a.Suggested = Suggest(a.Recommended)
			}
		}
	}
	return r, nil
}

// measure runs one delaySQL with args after the first four. It returns
// the distribution and the quantile asked for after Quantiles, if any.
func measure(ctx context.Context, q Querier, sql string, since, until time.Time, edges, qs []float64, extra ...any) (Distribution, float64, error) {
	neg := make([]float64, len(edges))
	for i, e := range edges {
		neg[len(edges)-1-i] = -e
	}
	d := Distribution{Edges: edges, Bins: make([]int64, len(edges)+1)}
	var quant []float64
	var lo, hi *float64
	var buckets, counts []int64
	err := q.QueryRow(ctx, sql, append([]any{since, until, neg, qs}, extra...)...).Scan(&d.Events, &quant, &lo, &hi, &buckets, &counts)
	if err != nil {
		return Distribution{}, 0, err
	}
	for i, bucket := range buckets {
		d.Bins[int64(len(edges))-bucket] += counts[i]
	}
	if d.Events == 0 || len(quant) < len(Quantiles) || lo == nil || hi == nil {
		return d, 0, nil
	}
	d.Quantiles, d.Min, d.Max = quant[:len(Quantiles)], *lo, *hi
	var targetQ float64
	if len(quant) > len(Quantiles) {
		targetQ = quant[len(Quantiles)]
	}
	return d, targetQ, nil
}

// estimate returns the planner's estimate of the rows explainSQL (an
// EXPLAIN (FORMAT JSON)) would read.
func estimate(ctx context.Context, q Querier, explainSQL string, args ...any) (float64, error) {
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := q.QueryRow(ctx, explainSQL, args...).Scan(&plan); err != nil {
		return 0, err
	}
	if len(plan) == 0 {
		return 0, errors.New("EXPLAIN returned no plan")
	}
	return plan[0].Plan.Rows, nil
}

// Beyond counts the events delayed more than h, which must be one of the
// edges.
func (d Distribution) Beyond(h float64) int64 {
	i := slices.Index(d.Edges, h)
	if i < 0 {
		return -1
	}
	var n int64
	for _, b := range d.Bins[i+1:] {
		n += b
	}
	return n
}

// withEdge returns edges with e inserted in order (once).
func withEdge(edges []float64, e float64) []float64 {
	out := slices.Clone(edges)
	if !slices.Contains(out, e) {
		out = append(out, e)
		slices.Sort(out)
	}
	return out
}

// Bounds returns the starts of the partitions of cal holding [since,
// until), followed by the end of the last: what width_bucket needs to map
// an event time to its partition's end.
func Bounds(cal aggregate.Calendar, since, until time.Time) []time.Time {
	parts := cal.Overlapping(since, until.Add(-time.Nanosecond))
	out := make([]time.Time, 0, len(parts)+1)
	for _, p := range parts {
		out = append(out, p.Start)
	}
	return append(out, parts[len(parts)-1].End)
}

// Suggest rounds a horizon up to a value for lateness_horizon: whole
// minutes under an hour, whole hours under a week, whole days beyond.
func Suggest(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Hour:
		return fmt.Sprintf("%dm", ceilDiv(d, time.Minute))
	case d < 7*24*time.Hour:
		return fmt.Sprintf("%dh", ceilDiv(d, time.Hour))
	}
	return fmt.Sprintf("%dd", ceilDiv(d, 24*time.Hour))
}

func ceilDiv(d, unit time.Duration) int64 { return int64((d + unit - 1) / unit) }

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
