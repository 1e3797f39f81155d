// Package benchplot writes the curves measured by tidemark's benchmarks as
// data and as charts, so that docs/benchmarks.md can show a run's numbers
// next to their picture and a later run can be compared with them.
//
// # Data
//
// A Table is one benchmark's results: named numeric columns, one row per
// measured point, and Meta, the run's environment (machine, versions, the
// command, the load from other processes). WriteJSON stores it as
// <dir>/<name>.json and Markdown renders the rows as a table for the log.
//
// # Charts
//
// A Figure is one or more panels side by side, each with a title, axis
// labels (with units), a legend and lines through the points of its
// Series; Table.Series picks a series out of a table's columns.
// WriteSVG draws the figure with gonum.org/v1/plot. Ticks sit at the
// measured x values, so a curve of three or four points reads like the
// table beside it. Fonts are not embedded: the files stay small and
// diffable, and viewers substitute a serif font.
package benchplot

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Table is one benchmark's measured points.
type Table struct {
	// Name is the file name without extension.
	Name  string `json:"name"`
	Title string `json:"title"`
	// Meta describes the run: machine, versions, command, load.
	Meta map[string]string `json:"meta"`
	// Columns names the values of each row, units included
	// (e.g. "tidemark_rows_per_s").
	Columns []string    `json:"columns"`
	Rows    [][]float64 `json:"rows"`
}

// Add appends a row; it must have one value per column.
func (t *Table) Add(values ...float64) error {
	if len(values) != len(t.Columns) {
		return fmt.Errorf("benchplot: %s: row of %d values for %d columns", t.Name, len(values), len(t.Columns))
	}
	t.Rows = append(t.Rows, values)
	return nil
}

// column returns the index of a column.
func (t *Table) column(name string) (int, error) {
	i := slices.Index(t.Columns, name)
	if i < 0 {
		return 0, fmt.Errorf("benchplot: %s: no column %q", t.Name, name)
	}
	return i, nil
}

// Series returns the points (x, y) of the rows whose columns equal the
// values of where (nil keeps every row), labelled for the legend.
func (t *Table) Series(label, x, y string, where map[string]float64) (Series, error) {
	s := Series{Label: label}
	xi, err := t.column(x)
	if err != nil {
		return s, err
	}
	yi, err := t.column(y)
	if err != nil {
		return s, err
	}
	idx := map[int]float64{}
	for col, v := range where {
		i, err := t.column(col)
		if err != nil {
			return s, err
		}
		idx[i] = v
	}
rows:
	for _, r := range t.Rows {
		for i, v := range idx {
			if r[i] != v {
				continue rows
			}
		}
		s.X, s.Y = append(s.X, r[xi]), append(s.Y, r[yi])
	}
	if len(s.X) == 0 {
		return s, fmt.Errorf("benchplot: %s: no rows for %s", t.Name, label)
	}
	return s, nil
}

// WriteJSON writes the table to dir/<name>.json, creating dir.
func (t *Table) WriteJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return fmt.Errorf("benchplot: %s: %w", t.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, t.Name+".json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	return nil
}

// Markdown renders the rows as a Markdown table, values rounded to what
// a reader compares: integers above 100, two decimals below.
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(t.Columns, " | ") + " |\n|")
	b.WriteString(strings.Repeat(" --- |", len(t.Columns)) + "\n")
	for _, r := range t.Rows {
		cells := make([]string, len(r))
		for i, v := range r {
			cells[i] = Format(v)
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	return b.String()
}

// Format writes a measured value for a table: thousands separated above
// 100, three significant digits below.
func Format(v float64) string {
	if math.Abs(v) >= 100 {
		s := strconv.FormatInt(int64(math.Round(v)), 10)
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		if neg {
			s = "-" + s
		}
		return s
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// Series is one line of a panel.
type Series struct {
	Label string
	X, Y  []float64
}

// Panel is one chart of a figure.
type Panel struct {
	Title string
	// XLabel and YLabel name the axes, units included.
	XLabel, YLabel string
	// LogX and LogY draw the axis on a logarithmic scale; its values must
	// be positive.
	LogX, LogY bool
	Series     []Series
	// Reference, when set, draws a dashed horizontal line at that y
	// value, labelled ReferenceLabel (a target, or parity at 1.0).
	Reference      *float64
	ReferenceLabel string
}

// Figure is a titled row of panels.
type Figure struct {
	Title  string
	Panels []Panel
}

// Size of one panel.
const (
	panelWidth  = 11 * vg.Centimeter
	panelHeight = 9 * vg.Centimeter
	titleHeight = 1 * vg.Centimeter
)

// WriteSVG draws the figure to path.
func (f Figure) WriteSVG(path string) error {
	if len(f.Panels) == 0 {
		return errors.New("benchplot: a figure needs a panel")
	}
	row := make([]*plot.Plot, len(f.Panels))
	for i, p := range f.Panels {
		pl, err := p.plot()
		if err != nil {
			return fmt.Errorf("benchplot: %s: %w", p.Title, err)
		}
		row[i] = pl
	}
	w, h := panelWidth*vg.Length(len(f.Panels)), panelHeight+titleHeight
	img := vgsvg.NewWith(vgsvg.UseWH(w, h), vgsvg.EmbedFonts(false))
	dc := draw.New(img)
	title := text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, 14),
		XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	dc.FillText(title, vg.Point{X: w / 2, Y: h - 2*vg.Millimeter}, f.Title)
	body := draw.Crop(dc, 0, 0, 0, -titleHeight)
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: 6 * vg.Millimeter, PadLeft: 2 * vg.Millimeter,
		PadRight: 4 * vg.Millimeter, PadBottom: 2 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, body)
	for i, pl := range row {
		pl.Draw(canvases[0][i])
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	if _, err := img.WriteTo(out); err != nil {
		out.Close()
		return fmt.Errorf("benchplot: %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	return nil
}

// plot builds the panel's chart: lines with markers, ticks at the
// measured x values, room above the lines for the legend.
func (p Panel) plot() (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text, pl.Y.Label.Text = p.XLabel, p.YLabel
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.XOffs = 2 * vg.Millimeter
	pl.Add(plotter.NewGrid())
	var xs []float64
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for i, s := range p.Series {
		if len(s.X) != len(s.Y) || len(s.X) == 0 {
			return nil, fmt.Errorf("series %q: %d x values, %d y values", s.Label, len(s.X), len(s.Y))
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			if (p.LogX && s.X[j] <= 0) || (p.LogY && s.Y[j] <= 0) {
				return nil, fmt.Errorf("series %q: point (%g, %g) on a logarithmic axis", s.Label, s.X[j], s.Y[j])
			}
			pts[j] = plotter.XY{X: s.X[j], Y: s.Y[j]}
			ymin, ymax = math.Min(ymin, s.Y[j]), math.Max(ymax, s.Y[j])
		}
		xs = append(xs, s.X...)
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		line.Width = vg.Points(1.5)
		points.Shape = plotutil.Shape(i)
		points.Radius = vg.Points(3)
		pl.Add(line, points)
		pl.Legend.Add(s.Label, line, points)
	}
	if p.Reference != nil {
		ref := *p.Reference
		ymin, ymax = math.Min(ymin, ref), math.Max(ymax, ref)
		slices.Sort(xs)
		line, err := plotter.NewLine(plotter.XYs{{X: xs[0], Y: ref}, {X: xs[len(xs)-1], Y: ref}})
		if err != nil {
			return nil, err
		}
		line.Color = plotutil.Color(len(p.Series))
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		pl.Add(line)
		pl.Legend.Add(p.ReferenceLabel, line)
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	ticks := make([]plot.Tick, len(xs))
	for i, x := range xs {
		ticks[i] = plot.Tick{Value: x, Label: short(x)}
	}
	pl.X.Tick.Marker = plot.ConstantTicks(ticks)
	legendRoom := 1 + 0.12*float64(len(p.Series)+1)
	if p.LogX {
		pl.X.Scale = plot.LogScale{}
		pl.X.Min, pl.X.Max = xs[0]/1.3, xs[len(xs)-1]*1.3
	} else {
		pad := (xs[len(xs)-1] - xs[0]) * 0.04
		pl.X.Min, pl.X.Max = xs[0]-pad, xs[len(xs)-1]+pad
	}
	if p.LogY {
		pl.Y.Scale = plot.LogScale{}
		pl.Y.Tick.Marker = shortTicks{plot.LogTicks{Prec: -1}}
		pl.Y.Min = math.Pow(10, math.Floor(math.Log10(ymin)))
		pl.Y.Max = math.Pow(10, math.Log10(ymax)+(math.Log10(ymax)-math.Log10(pl.Y.Min))*(legendRoom-1)*1.2)
	} else {
		pl.Y.Min, pl.Y.Max = 0, ymax*(legendRoom+0.1)
		pl.Y.Tick.Marker = shortTicks{plot.DefaultTicks{}}
	}
	return pl, nil
}

// shortTicks labels the ticks of another ticker like 120k.
type shortTicks struct{ plot.Ticker }

// Ticks implements plot.Ticker.
func (s shortTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := s.Ticker.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = short(ts[i].Value)
		}
	}
	return ts
}

// short writes 1500 as 1.5k and 2000000 as 2M.
func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}
