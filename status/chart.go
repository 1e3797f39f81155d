package status

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/lateness"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH                       = 600, 242
	padLeft, padRight, padTop, padBottom = 48, 16, 46, 40
	plotW, plotH                         = chartW - padLeft - padRight, chartH - padTop - padBottom
)

// svg accumulates the elements of one chart.
type svg struct{ b strings.Builder }

func (s *svg) add(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

// text adds an escaped label.
func (s *svg) text(x, y float64, anchor, class, label string) {
	s.add(`<text x="%.1f" y="%.1f" text-anchor="%s" class="%s">%s</text>`, x, y, anchor, class, html.EscapeString(label))
}

// sideText adds a label beside the vertical line at x: to its right, or
// to its left in the right third of the chart.
func (s *svg) sideText(x, y float64, class, label string) {
	if x > padLeft+float64(plotW)*2/3 {
		s.text(x-4, y, "end", class, label)
		return
	}
	s.text(x+4, y, "start", class, label)
}

// latenessChart draws the distribution of the delay of a's events after
// their partition's end: one bar per bin, the bins beyond the horizon in
// their own colour, the horizon as a dashed line on its bin edge, and the
// quantiles and the maximum as marks above the bars.
func latenessChart(a lateness.Aggregate) template.HTML {
	d := a.PastEnd
	var s svg
	s.add(`<svg class="chart lateness" viewBox="0 0 %d %d" role="img" aria-label="%s" data-aggregate="%s" data-events="%d" data-beyond="%d" data-horizon-seconds="%g">`,
		chartW, chartH, html.EscapeString("arrival delay after the partition's end, "+a.Name), html.EscapeString(a.Name), d.Events, a.Beyond, a.Horizon.Seconds())
	if d.Events == 0 || len(d.Quantiles) < len(lateness.Quantiles) {
		s.text(chartW/2, chartH/2, "middle", "note", "no events in the window")
		s.add(`</svg>`)
		return template.HTML(s.b.String())
	}
	var most int64
	for _, n := range d.Bins {
		most = max(most, n)
	}
	bw := float64(plotW) / float64(len(d.Bins))
	hi := slices.Index(d.Edges, a.Horizon.Seconds())
	for i, n := range d.Bins {
		class := "within"
		switch {
		case i == 0 && d.Edges[0] == 0:
			class = "early"
		case hi >= 0 && i > hi:
			class = "beyond"
		}
		h := float64(plotH) * float64(n) / float64(most)
		x := padLeft + float64(i)*bw
		s.add(`<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-bin="%d" data-count="%d"><title>%s: %d events (%s)</title></rect>`,
			class, x+1, padTop+float64(plotH)-h, bw-2, h, i, n, html.EscapeString(lateness.BinLabel(d.Edges, i, "by the partition's end")), n,
			lateness.Percent(float64(n)/float64(d.Events)))
		if n > 0 {
			s.text(x+bw/2, padTop+float64(plotH)-h-3, "middle", "count", fmt.Sprint(n))
		}
	}
	// Axis and edge labels.
	base := float64(padTop + plotH)
	s.add(`<line class="axis" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, padLeft, base, padLeft+plotW, base)
	for j, e := range d.Edges {
		x := padLeft + float64(j+1)*bw
		s.add(`<line class="tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, x, base, x, base+4)
		s.text(x, base+15, "middle", "label", lateness.Format(time.Duration(e*float64(time.Second))))
	}
	s.text(padLeft+float64(plotW)/2, base+32, "middle", "axis-title", "ingestion after the end of the event's partition")
	s.text(padLeft-6, padTop+8, "end", "label", lateness.Percent(float64(most)/float64(d.Events)))
	s.text(padLeft-6, base, "end", "label", "0")
	if hi >= 0 {
		x := padLeft + float64(hi+1)*bw
		s.add(`<line class="horizon" x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" data-seconds="%g"/>`, x, padTop, x, base, a.Horizon.Seconds())
		s.sideText(x, padTop+12, "horizon-label", fmt.Sprintf("horizon %s: %d beyond", lateness.Format(a.Horizon), a.Beyond))
	}
	// Quantile marks: a bin's position, interpolated linearly inside it.
	pos := func(v float64) float64 {
		i := 0
		for i < len(d.Edges) && v > d.Edges[i] {
			i++
		}
		lo, up := d.Min, d.Max
		if i > 0 {
			lo = d.Edges[i-1]
		}
		if i < len(d.Edges) {
			up = d.Edges[i]
		}
		f := 0.5
		if up > lo {
			f = math.Min(1, math.Max(0, (v-lo)/(up-lo)))
		}
		return padLeft + (float64(i)+f)*bw
	}
	marks := []struct {
		name string
		v    float64
	}{}
	for i, q := range lateness.Quantiles {
		if q == 0.999 {
			continue // p99.9 crowds p99 and max at this scale
		}
		marks = append(marks, struct {
			name string
			v    float64
		}{quantileLabel(q), d.Quantiles[i]})
	}
	marks = append(marks, struct {
		name string
		v    float64
	}{"max", d.Max})
	// Labels on up to four rows above the plot, so that close marks do
	// not overwrite each other.
	var rowEnd [4]float64
	for _, m := range marks {
		x := pos(m.v)
		label := m.name + " " + lateness.Format(time.Duration(m.v*float64(time.Second)))
		w := 6.5 * float64(len(label))
		row := 0
		for row < len(rowEnd)-1 && rowEnd[row] > x-w/2-4 {
			row++
		}
		rowEnd[row] = x + w/2
		y := float64(padTop - 36 + 10*row)
		s.add(`<g class="quantile" data-q="%s" data-seconds="%g"><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, m.name, m.v, x, y+2, x, base)
		s.text(x, y, "middle", "quantile-label", label)
		s.add(`</g>`)
	}
	s.add(`</svg>`)
	return template.HTML(s.b.String())
}

// curvePoint is a partition that is not final, placed on the curve.
type curvePoint struct {
	key   string
	age   float64
	share float64
}

// curveChart draws an aggregate's arrival curve: the share of a final
// partition's rows that had arrived by each age (time after the
// partition's end), as a step line, with the partition end and the horizon
// marked, and the partitions that are not final placed at their age and
// completeness estimate — read off this curve.
func curveChart(c *lateness.ArrivalCurve, ag Aggregate, now time.Time) template.HTML {
	var s svg
	hz := time.Duration(ag.HorizonSeconds) * time.Second
	s.add(`<svg class="chart curve" viewBox="0 0 %d %d" role="img" aria-label="%s" data-aggregate="%s" data-partitions="%d" data-points="%d">`,
		chartW, chartH, html.EscapeString("arrival curve of "+ag.Name), html.EscapeString(ag.Name), c.Partitions, len(c.Points))
	var open []curvePoint
	for _, p := range ag.Partitions {
		if p.Completeness == nil || p.State == "final" || p.State == "archived" {
			continue
		}
		open = append(open, curvePoint{p.Key, now.Sub(p.End).Seconds(), *p.Completeness})
	}
	lo, up := math.Min(0, float64(c.Points[0].Age)), math.Max(float64(c.Points[len(c.Points)-1].Age), hz.Seconds())
	for _, p := range open {
		lo = math.Min(lo, p.age)
	}
	if up <= lo {
		up = lo + 3600 // every point at one age and no horizon: an hour wide
	}
	up += (up - lo) * 0.04
	x := func(age float64) float64 {
		return padLeft + float64(plotW)*(math.Min(math.Max(age, lo), up)-lo)/(up-lo)
	}
	y := func(share float64) float64 { return padTop + float64(plotH)*(1-share) }
	base := y(0)
	// Grid lines at 0, 50, 90 and 100%.
	for _, g := range []float64{0, 0.5, 0.9, 1} {
		s.add(`<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, padLeft, y(g), padLeft+plotW, y(g))
		s.text(padLeft-6, y(g)+4, "end", "label", lateness.Percent(g))
	}
	// Time ticks at a round step.
	step := 3600.0
	for _, st := range []float64{3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400} {
		step = st
		if (up-lo)/st <= 10 {
			break
		}
	}
	for t := math.Ceil(lo/step) * step; t <= up; t += step {
		s.add(`<line class="tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, x(t), base, x(t), base+4)
		s.text(x(t), base+15, "middle", "label", lateness.Format(time.Duration(t*float64(time.Second))))
	}
	s.text(padLeft+float64(plotW)/2, base+32, "middle", "axis-title", "time after the partition's end")
	// The step line: the share stays until the next age step.
	var path strings.Builder
	fmt.Fprintf(&path, "M%.1f,%.1f", x(lo), base)
	for _, p := range c.Points {
		fmt.Fprintf(&path, " H%.1f V%.1f", x(float64(p.Age)), y(p.Share))
	}
	fmt.Fprintf(&path, " H%.1f", x(up))
	s.add(`<path class="curve-line" d="%s"/>`, path.String())
	s.add(`<line class="end" x1="%.1f" y1="%d" x2="%.1f" y2="%.1f"/>`, x(0), padTop-14, x(0), base)
	s.sideText(x(0), padTop-18, "end-label", "partition end")
	s.add(`<line class="horizon" x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" data-seconds="%g"/>`, x(hz.Seconds()), padTop-14, x(hz.Seconds()), base, hz.Seconds())
	s.sideText(x(hz.Seconds()), padTop-18, "horizon-label", "horizon "+lateness.Format(hz)+": final")
	for i, p := range open {
		cx, cy := x(p.age), y(p.share)
		s.add(`<g class="partition" data-partition="%s" data-age-seconds="%.0f" data-completeness="%g"><circle cx="%.1f" cy="%.1f" r="4.5"/>`,
			html.EscapeString(p.key), p.age, p.share, cx, cy)
		label, ly := p.key+" "+lateness.Percent(p.share), cy+4+float64(12*(i%2))
		if cx > padLeft+float64(plotW)*2/3 {
			s.text(cx-7, ly, "end", "point-label", label)
		} else {
			s.text(cx+7, ly, "start", "point-label", label)
		}
		s.add(`</g>`)
	}
	s.add(`</svg>`)
	return template.HTML(s.b.String())
}
