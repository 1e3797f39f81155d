package lateness

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the report for people: the delay quantiles and bins
// of the source and, per aggregate, the delay after the partition's end,
// the share the configured horizon keeps and the recommended horizon.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "lateness of source %s: events with event times from %s to %s\n", r.Source,
		r.Since.Format(time.RFC3339), r.Until.Format(time.RFC3339))
	if r.SamplePercent < 100 {
		fmt.Fprintf(tw, "(measured on a %.3g%% sample of the raw table's blocks)\n", r.SamplePercent)
	}
	if r.Delay.Events == 0 {
		fmt.Fprintln(tw, "no events in this range")
		return tw.Flush()
	}
	fmt.Fprintf(tw, "\n%d events; delay of ingestion after the event time:\n", r.Delay.Events)
	writeDistribution(tw, r.Delay, "by the event time")
	for _, a := range r.Aggregates {
		fmt.Fprintf(tw, "\naggregate %s (%s, lateness_horizon %s): delay after the end of the event's partition:\n",
			a.Name, a.Calendar, Format(a.Horizon))
		writeDistribution(tw, a.PastEnd, "by the partition's end")
		fmt.Fprintf(tw, "  within the horizon\t%s of events (%d beyond it)\n", Percent(a.Kept), a.Beyond)
		fmt.Fprintf(tw, "  smallest horizon keeping %s\t%s (lateness_horizon: %s)\n", Percent(r.Target), Format(a.Recommended), a.Suggested)
	}
	return tw.Flush()
}

// writeDistribution writes the quantiles, then one line per bin with a
// bar.
func writeDistribution(w io.Writer, d Distribution, early string) {
	if d.Events == 0 || len(d.Quantiles) < len(Quantiles) {
		fmt.Fprintln(w, "  no events")
		return
	}
	var qs []string
	for i, q := range Quantiles {
		qs = append(qs, fmt.Sprintf("p%s %s", strconv.FormatFloat(q*100, 'f', -1, 64), Format(seconds(d.Quantiles[i]))))
	}
	qs = append(qs, "max "+Format(seconds(d.Max)))
	fmt.Fprintf(w, "  %s\n", strings.Join(qs, "  "))
	var most int64
	for _, n := range d.Bins {
		most = max(most, n)
	}
	for i, n := range d.Bins {
		bar := strings.Repeat("#", int(math.Ceil(30*float64(n)/float64(max(most, 1)))))
		fmt.Fprintf(w, "  %s\t%d\t%s\t%s\n", BinLabel(d.Edges, i, early), n, Percent(float64(n)/float64(d.Events)), bar)
	}
}

// BinLabel names bin i of edges: "before …" for the first when its edge
// is 0, "< 15m" for the next, "≥ 30d" for the last.
func BinLabel(edges []float64, i int, early string) string {
	switch {
	case i == 0 && edges[0] == 0:
		return early
	case i == 0:
		return "< " + Format(seconds(edges[0]))
	case i == len(edges):
		return "≥ " + Format(seconds(edges[i-1]))
	}
	return Format(seconds(edges[i-1])) + " – " + Format(seconds(edges[i]))
}

// Percent formats a share in percent with as many decimals as it takes to
// tell it from 100%: 64.8%, 99.92%.
func Percent(f float64) string {
	switch {
	case f >= 1:
		return "100%"
	case f >= 0.999:
		return strconv.FormatFloat(math.Floor(f*1e5)/1e3, 'f', -1, 64) + "%"
	case f >= 0.99:
		return strconv.FormatFloat(math.Floor(f*1e4)/1e2, 'f', -1, 64) + "%"
	}
	return strconv.FormatFloat(math.Round(f*1e3)/10, 'f', -1, 64) + "%"
}

// Format writes a duration compactly, to the second under an hour and to
// the minute beyond, in hours up to four days and in days and hours
// beyond: 0s, 42s, 14m, 2h10m, 49h37m, 5d9h, -13h.
func Format(d time.Duration) string {
	if d < 0 {
		return "-" + Format(-d)
	}
	d = d.Round(time.Second)
	day, h, m, s := d/(24*time.Hour), d%(24*time.Hour)/time.Hour, d%time.Hour/time.Minute, d%time.Minute/time.Second
	if day < 4 {
		day, h = 0, d/time.Hour
	}
	var b strings.Builder
	if day > 0 {
		fmt.Fprintf(&b, "%dd", day)
	}
	if h > 0 {
		fmt.Fprintf(&b, "%dh", h)
	}
	if m > 0 && day == 0 {
		fmt.Fprintf(&b, "%dm", m)
	}
	if s > 0 && day == 0 && h == 0 {
		fmt.Fprintf(&b, "%ds", s)
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
