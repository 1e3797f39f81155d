package status

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/lateness"
)

// Page is what the status page at / shows: the report, and what only the
// page draws: the lateness of each source's recent events, the arrival
// curve of each aggregate, and the live state of CDC slots.
type Page struct {
	Report *Report
	// Lateness and LatenessError hold, per source, the lateness of the
	// events of the last LatenessWindow, or why it could not be measured.
	Lateness      map[string]*lateness.Report
	LatenessError map[string]string
	// Curves and CurveError hold, per aggregate, the arrival curve of its
	// latest final partitions, or why there is none.
	Curves     map[string]*lateness.ArrivalCurve
	CurveError map[string]string
	// Slots holds, per CDC source, its slot's state as this instance last
	// saw it; absent when this instance does not run the source's reader.
	Slots map[string]cdc.SlotReading
	// SchemaRegistry, when set, says since when the schema registry is
	// unreachable and why, as this instance's ingester last saw it.
	SchemaRegistry string
	// Stalled lists the sources whose writes the warehouse refuses, as
	// this instance's ingester last saw them.
	Stalled []StalledSource
	// Resets lists, as this instance's ingester found them, the latest
	// partitions whose stored position was beyond the broker's log (the
	// topic recreated, or records lost at the broker), read again from
	// below it.
	Resets []OffsetReset
	// Refresh, when positive, reloads the page every Refresh seconds.
	Refresh int
}

// StalledSource is a source whose writes the warehouse refuses: its
// partitions wait while the other sources go on.
type StalledSource struct {
	Name  string
	Since time.Time
	// Cause is the last failure, Fix what to do about it.
	Cause, Fix string
}

// OffsetReset is a partition read again from below its stored position,
// its log at the broker having lost records.
type OffsetReset struct {
	At   time.Time
	What string
}

// LatenessWindow is how far back in event time the page measures
// lateness, and LatenessRows the rows it reads at most (it samples beyond).
const (
	LatenessWindow       = 7 * 24 * time.Hour
	LatenessRows   int64 = 200_000
)

// LatenessRange is the range of event times the page measures the
// lateness of source's events over: the LatenessWindow before now minus the
// longest horizon of the source's aggregates, so that every partition in
// it is final and its late events, beyond the horizon too, have arrived
// as far as the horizon looks.
func LatenessRange(cfg *config.Config, source string, now time.Time) (since, until time.Time) {
	var longest time.Duration
	for _, a := range cfg.Aggregates {
		if a.Source == source {
			longest = max(longest, a.LatenessHorizon.Duration())
		}
	}
	until = now.Add(-longest)
	return until.Add(-LatenessWindow), until
}

// LatenessFunc measures the lateness of one source, for the page; the
// service caches what it returns.
type LatenessFunc func(ctx context.Context, source string) (*lateness.Report, error)

// BuildPage gathers what the page shows besides the report: lateness
// through measure and the arrival curves from q. Failures of either are
// shown on the page rather than failing it.
func BuildPage(ctx context.Context, q Querier, cfg *config.Config, rep *Report, measure LatenessFunc) *Page {
	p := &Page{Report: rep, Lateness: map[string]*lateness.Report{}, LatenessError: map[string]string{},
		Curves: map[string]*lateness.ArrivalCurve{}, CurveError: map[string]string{}, Slots: map[string]cdc.SlotReading{}}
	measured := map[string]bool{}
	for _, a := range rep.Aggregates {
		if !measured[a.Source] {
			measured[a.Source] = true
			l, err := measure(ctx, a.Source)
			if err != nil {
				p.LatenessError[a.Source] = err.Error()
			} else {
				p.Lateness[a.Source] = l
			}
		}
		c, err := lateness.Curve(ctx, q, a.Name, lateness.HistoryPartitions(cfg.Aggregates[a.Name].Partition.By))
		switch {
		case errors.Is(err, lateness.ErrNoHistory):
			p.CurveError[a.Name] = "no final partition has an arrival history yet: the curve appears once the first partitions are final"
		case err != nil:
			p.CurveError[a.Name] = err.Error()
		default:
			p.Curves[a.Name] = c
		}
	}
	return p
}

//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"time":     fmtAnyTime,
	"age":      func(now time.Time, t *time.Time) string { return fmtAge(now, t) },
	"int":      fmtInt,
	"ratio":    fmtRatio,
	"percent":  func(p *float64) string { return fmt.Sprintf("%.1f", *p) },
	"bytes":    fmtBytes,
	"dur":      lateness.Format,
	"pct":      lateness.Percent,
	"seconds":  func(s float64) string { return lateness.Format(time.Duration(s * float64(time.Second))) },
	"quantile": quantileLabel,
	"reasons":  sortedReasons,
	"cellText": cellText,
	"shortKey": shortKey,
	"cellTitle": func(p AggPartition) string {
		return cellTitle(p)
	},
	"latenessChart": latenessChart,
	"curveChart":    curveChart,
	"oldestFirst": func(ps []AggPartition) []AggPartition {
		out := slices.Clone(ps)
		slices.Reverse(out)
		return out
	},
	"quantiles": func() []float64 { return lateness.Quantiles },
	"toInt":     func(f float64) int64 { return int64(f) },
	"secs":      func(n int64) time.Duration { return time.Duration(n) * time.Second },
	"join":      strings.Join,
	"lower":     strings.ToLower,
}).Parse(pageHTML))

// WriteHTML writes the page.
func (p *Page) WriteHTML(w io.Writer) error {
	return pageTemplate.Execute(w, p)
}

// AggregateLateness returns the lateness of aggregate name's events, or
// nil when its source's could not be measured.
func (p *Page) AggregateLateness(name, source string) *lateness.Aggregate {
	l := p.Lateness[source]
	if l == nil {
		return nil
	}
	for i := range l.Aggregates {
		if l.Aggregates[i].Name == name {
			return &l.Aggregates[i]
		}
	}
	return nil
}

// ResyncUnderWay returns the resync of c that the reader copies, or will
// copy first; nil when all are done.
func (c *CDC) ResyncUnderWay() *Resync {
	for i := range c.Resyncs {
		if c.Resyncs[i].State != "done" {
			return &c.Resyncs[i]
		}
	}
	return nil
}

// ResyncsWaiting counts the resyncs of c pending after the one under way.
func (c *CDC) ResyncsWaiting() int {
	n := 0
	for _, r := range c.Resyncs {
		if r.State == "pending" {
			n++
		}
	}
	if u := c.ResyncUnderWay(); u != nil && u.State == "pending" {
		n--
	}
	return n
}

// Target is the share the recommended horizons keep.
func (p *Page) Target() float64 {
	for _, l := range p.Lateness {
		return l.Target
	}
	return lateness.DefaultTarget
}

// WindowText names the lateness window: "7 days".
func (p *Page) WindowText() string {
	return fmt.Sprintf("%d days", int(LatenessWindow/(24*time.Hour)))
}

// fmtAnyTime formats a time or a time pointer like fmtTime.
func fmtAnyTime(v any) string {
	switch t := v.(type) {
	case time.Time:
		return fmtTime(&t)
	case *time.Time:
		return fmtTime(t)
	}
	return fmt.Sprint(v)
}

// fmtAge writes how long ago t was: "3m ago", or "-" for none.
func fmtAge(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	d := now.Sub(*t)
	if d < 0 {
		return "in " + lateness.Format(-d.Round(time.Second))
	}
	return lateness.Format(d.Round(time.Second)) + " ago"
}

func quantileLabel(q float64) string {
	return "p" + strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", q*100), "0"), ".")
}

// reason is one dead-letter reason with its count.
type reason struct {
	Reason string
	Count  int64
}

func sortedReasons(m map[string]int64) []reason {
	out := make([]reason, 0, len(m))
	for k, v := range m {
		out = append(out, reason{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Reason < out[j].Reason })
	return out
}

// cellText is the second line of a grid cell: completeness and rebuilds.
func cellText(p AggPartition) string {
	parts := []string{}
	switch {
	case p.State == "queued":
		parts = append(parts, "not built")
	case p.Completeness != nil:
		parts = append(parts, lateness.Percent(*p.Completeness))
	default:
		parts = append(parts, "–")
	}
	parts = append(parts, fmt.Sprintf("×%d", p.Rebuilds))
	return strings.Join(parts, " ")
}

// shortKey drops the year from a partition label for a grid cell:
// 2026-10-05 becomes 10-05, 2026-10-05T08:00Z 10-05 08:00; the cell's
// tooltip has the whole label.
func shortKey(key string) string {
	if len(key) < 10 || key[4] != '-' {
		return key
	}
	return strings.TrimSuffix(strings.Replace(key[5:], "T", " ", 1), "Z")
}

// cellTitle is a grid cell's tooltip: everything about the partition.
func cellTitle(p AggPartition) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", p.Key, p.State)
	if p.Queued {
		b.WriteString(", queued for a rebuild")
	}
	if p.FailedAttempts > 0 {
		fmt.Fprintf(&b, ", %d failed attempts", p.FailedAttempts)
	}
	fmt.Fprintf(&b, "\nrows %s, completeness %s, %d rebuilds, last %s\nfinal at %s",
		fmtInt(p.Rows), fmtRatio(p.Completeness), p.Rebuilds, fmtTime(p.RebuiltAt), p.FinalAt.Format(time.RFC3339))
	return b.String()
}
