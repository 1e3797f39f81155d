package status

import (
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/lateness"
)

// TestPageEdgeCases renders pages whose charts have nothing to scale by:
// no events in the lateness window, an arrival curve at one age with a
// zero horizon, a partition without an estimate. The page must be whole
// and every coordinate a number.
func TestPageEdgeCases(t *testing.T) {
	now := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	half := 0.5
	agg := Aggregate{Name: "daily", Source: "app", Partition: "day in UTC", Horizon: "0s", Partitions: []AggPartition{
		{Key: "2026-10-05", Start: now.Truncate(24 * time.Hour), End: now.Truncate(24 * time.Hour).Add(24 * time.Hour), State: "open", Completeness: &half},
		{Key: "2026-10-04", Start: now.Truncate(24 * time.Hour).Add(-24 * time.Hour), End: now.Truncate(24 * time.Hour), State: "queued", Queued: true, FailedAttempts: 2},
	}}
	empty := lateness.Distribution{Edges: lateness.Edges, Bins: make([]int64, len(lateness.Edges)+1)}
	// No partition with an estimate to place on the curve.
	bare := agg
	bare.Partitions = agg.Partitions[1:]
	tests := []struct {
		name string
		page *Page
	}{
		{"no events, one-age curve, zero horizon", &Page{
			Report: &Report{GeneratedAt: now, Aggregates: []Aggregate{bare}},
			Lateness: map[string]*lateness.Report{"app": {Source: "app", Since: now.Add(-7 * 24 * time.Hour), Until: now, SamplePercent: 100, Delay: empty,
				Aggregates: []lateness.Aggregate{{Name: "daily", PastEnd: empty}}}},
			Curves:        map[string]*lateness.ArrivalCurve{"daily": {Aggregate: "daily", Partitions: 1, Points: []lateness.Point{{Age: 0, Share: 1}}}},
			LatenessError: map[string]string{}, CurveError: map[string]string{}, Slots: map[string]cdc.SlotReading{},
		}},
		{"errors instead of charts", &Page{
			Report:        &Report{GeneratedAt: now, Aggregates: []Aggregate{agg}},
			Lateness:      map[string]*lateness.Report{},
			LatenessError: map[string]string{"app": "lateness of app: context deadline exceeded <&>"},
			Curves:        map[string]*lateness.ArrivalCurve{},
			CurveError:    map[string]string{"daily": "no final partition"},
			Slots:         map[string]cdc.SlotReading{},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := tt.page.WriteHTML(&b); err != nil {
				t.Fatal(err)
			}
			html := b.String()
			for _, bad := range []string{"NaN", "Inf", "<&>", "%!"} {
				if strings.Contains(html, bad) {
					t.Errorf("page contains %q", bad)
				}
			}
			if !strings.HasSuffix(strings.TrimSpace(html), "</html>") {
				t.Errorf("page is cut short:\n%s", html[max(0, len(html)-300):])
			}
		})
	}
}

// TestPageSchemaRegistry checks that the page names an unreachable
// schema registry, and says nothing of it otherwise.
func TestPageSchemaRegistry(t *testing.T) {
	now := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	for _, msg := range []string{"", "schema registry unreachable since 2026-10-05T09:58:00Z: HTTP 503 <b>"} {
		p := &Page{Report: &Report{GeneratedAt: now}, Lateness: map[string]*lateness.Report{}, LatenessError: map[string]string{},
			Curves: map[string]*lateness.ArrivalCurve{}, CurveError: map[string]string{}, Slots: map[string]cdc.SlotReading{}, SchemaRegistry: msg}
		var b strings.Builder
		if err := p.WriteHTML(&b); err != nil {
			t.Fatal(err)
		}
		html := b.String()
		shown := strings.Contains(html, `id="schema-registry"`)
		if shown != (msg != "") {
			t.Errorf("SchemaRegistry %q: the page shows the registry's state: %v", msg, shown)
		}
		if msg != "" && !strings.Contains(html, "schema registry unreachable since 2026-10-05T09:58:00Z: HTTP 503 &lt;b&gt;") {
			t.Errorf("the page does not say why, escaped")
		}
	}
}

// TestPageIngestTrouble checks that the page names each stalled source
// with its cause and fix, and each partition read again from below its
// stored position.
func TestPageIngestTrouble(t *testing.T) {
	now := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	p := &Page{Report: &Report{GeneratedAt: now}, Lateness: map[string]*lateness.Report{}, LatenessError: map[string]string{},
		Curves: map[string]*lateness.ArrivalCurve{}, CurveError: map[string]string{}, Slots: map[string]cdc.SlotReading{},
		Stalled: []StalledSource{{Name: "orders", Since: now.Add(-time.Minute), Cause: "permission denied for table orders <x>", Fix: "grant INSERT"}},
		Resets:  []OffsetReset{{At: now, What: "events/0: stored position 6, but the broker's log ends at 3"}},
	}
	var b strings.Builder
	if err := p.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{`data-stalled="orders"`, "permission denied for table orders &lt;x&gt;", "grant INSERT",
		"data-reset", "events/0: stored position 6, but the broker&#39;s log ends at 3"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
