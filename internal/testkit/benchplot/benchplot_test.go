package benchplot_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
)

func TestTableAndFigure(t *testing.T) {
	t.Parallel()
	tab := &benchplot.Table{Name: "ingest", Title: "ingest", Columns: []string{"partitions", "instances", "rows_per_s"}}
	for _, r := range [][]float64{{1, 1, 90_000}, {4, 1, 120_000}, {16, 1, 125_000}, {1, 2, 88_000}, {4, 2, 150_000}, {16, 2, 160_000}} {
		if err := tab.Add(r...); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Add(1); err == nil {
		t.Fatal("a short row was accepted")
	}
	dir := t.TempDir()
	if d := os.Getenv("BENCHPLOT_PREVIEW"); d != "" {
		dir = d
	}
	if err := tab.WriteJSON(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ingest.json")); err != nil {
		t.Fatal(err)
	}
	if md := tab.Markdown(); !strings.Contains(md, "| 4 | 2 | 150,000 |") {
		t.Fatalf("markdown:\n%s", md)
	}
	one, err := tab.Series("1 instance", "partitions", "rows_per_s", map[string]float64{"instances": 1})
	if err != nil {
		t.Fatal(err)
	}
	two, err := tab.Series("2 instances", "partitions", "rows_per_s", map[string]float64{"instances": 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.X) != 3 || two.Y[2] != 160_000 {
		t.Fatalf("series %+v %+v", one, two)
	}
	if _, err := tab.Series("none", "partitions", "rows_per_s", map[string]float64{"instances": 3}); err == nil {
		t.Fatal("an empty series was returned without error")
	}
	parity := 1.0
	fig := benchplot.Figure{Title: "Kafka ingest", Panels: []benchplot.Panel{
		{Title: "throughput", XLabel: "partitions", YLabel: "rows/s", LogX: true, Series: []benchplot.Series{one, two}},
		{Title: "ratio", XLabel: "partitions", YLabel: "ratio", LogX: true, LogY: true, Series: []benchplot.Series{one, two},
			Reference: &parity, ReferenceLabel: "parity"},
	}}
	path := filepath.Join(dir, "ingest.svg")
	if err := fig.WriteSVG(path); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Kafka ingest", "2 instances", "parity", "rows/s"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{1234567.4: "1,234,567", 0.6789: "0.679", 42: "42", 100: "100", -2500: "-2,500"} {
		if got := benchplot.Format(v); got != want {
			t.Errorf("Format(%g) = %q, want %q", v, got, want)
		}
	}
}
