package mirror

import "testing"

// TestSamplePercent: the first level's sample reads enough pages that a
// table of narrow rows does not return an empty sample, and never more
// than the whole table.
func TestSamplePercent(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		target, estimate, pages int64
		want                    float64
	}{
		{name: "wide rows: by rows", target: 800, estimate: 1_000_000, pages: 100_000, want: 0.08},
		{name: "narrow rows: by pages", target: 800, estimate: 50_000, pages: 295, want: 100 * 32.0 / 295},
		{name: "pages unknown", target: 800, estimate: 50_000, pages: 0, want: 1.6},
		{name: "small table: all of it", target: 800, estimate: 16_000, pages: 20, want: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := samplePercent(tc.target, tc.estimate, tc.pages)
			if d := got - tc.want; d > 1e-9 || d < -1e-9 {
				t.Errorf("samplePercent(%d, %d, %d) = %v; want %v", tc.target, tc.estimate, tc.pages, got, tc.want)
			}
		})
	}
}
