package aggregate

import (
	"strings"
	"testing"
	"time"
)

// name is a name of n bytes: prefix, then tail repeated.
func name(t *testing.T, prefix string, tail byte, n int) string {
	t.Helper()
	if len(prefix) > n {
		t.Fatalf("prefix %q is longer than %d", prefix, n)
	}
	return prefix + strings.Repeat(string(tail), n-len(prefix))
}

func TestDerivedName(t *testing.T) {
	prefix50 := name(t, "daily_sales_", 'x', 50)
	col63 := name(t, "sale_date_", 'c', 63)
	tests := []struct {
		name, base, suffix string
		want               string // the exact name, when pinned
		keep               string // otherwise the start it must have
	}{
		{name: "short shadow", base: "daily_sales", suffix: "__shadow", want: "daily_sales__shadow"},
		{name: "short index", base: "daily_sales", suffix: "_sale_date", want: "daily_sales_sale_date"},
		{name: "exactly 63", base: name(t, "daily_sales_", 'y', 55), suffix: "__shadow", want: name(t, "daily_sales_", 'y', 55) + "__shadow"},
		{name: "62 and the suffix", base: name(t, "daily_sales_", 'y', 62), suffix: "__shadow", keep: name(t, "daily_sales_", 'y', 46)},
		{name: "63 and the suffix", base: name(t, "daily_sales_", 'y', 63), suffix: "__shadow",
			// Pinned: shadow tables are found again by this name.
			want: "daily_sales_yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy_541ea9ea__shadow"},
		{name: "shared prefix a", base: name(t, prefix50, 'a', 63), suffix: "__shadow", keep: prefix50[:46]},
		{name: "shared prefix b", base: name(t, prefix50, 'b', 63), suffix: "__shadow", keep: prefix50[:46]},
		{name: "shared prefix a, index", base: name(t, prefix50, 'a', 63), suffix: "_sale_date", keep: prefix50[:44]},
		{name: "shared prefix b, index", base: name(t, prefix50, 'b', 63), suffix: "_sale_date", keep: prefix50[:44]},
		{name: "long table, long column", base: name(t, prefix50, 'a', 63), suffix: "_" + col63, keep: prefix50[:27]},
		{name: "short table, long column", base: "t", suffix: "_" + col63, keep: "t_"},
		{name: "long suffix alone", base: "t", suffix: "_" + name(t, "sale_date_", 'c', 61), want: "t_" + name(t, "sale_date_", 'c', 61)},
		{name: "a base ending in a hash and the suffix", base: "daily_sales_yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy_541ea9ea__shadow", suffix: "__shadow",
			keep: "daily_sales_yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy_"},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := derivedName(tt.base, tt.suffix)
			switch {
			case tt.want != "" && got != tt.want:
				t.Errorf("derivedName(%q, %q) = %q, want %q", tt.base, tt.suffix, got, tt.want)
			case tt.want == "" && (len(got) != maxIdentLen || !strings.HasPrefix(got, tt.keep)):
				t.Errorf("derivedName(%q, %q) = %q (%d bytes), want %d bytes starting %q", tt.base, tt.suffix, got, len(got), maxIdentLen, tt.keep)
			}
			if len(got) > maxIdentLen {
				t.Errorf("derivedName(%q, %q) = %q: %d bytes, PostgreSQL keeps %d", tt.base, tt.suffix, got, len(got), maxIdentLen)
			}
			if got == tt.base {
				t.Errorf("derivedName(%q, %q) is the base itself", tt.base, tt.suffix)
			}
			if again := derivedName(tt.base, tt.suffix); again != got {
				t.Errorf("derivedName(%q, %q) = %q, then %q", tt.base, tt.suffix, got, again)
			}
			if len(tt.suffix) <= 27 && !strings.HasSuffix(got, tt.suffix) {
				t.Errorf("derivedName(%q, %q) = %q lost its suffix", tt.base, tt.suffix, got)
			}
			if other, ok := seen[got]; ok {
				t.Errorf("derivedName(%q, %q) = %q, as for %s", tt.base, tt.suffix, got, other)
			}
			seen[got] = tt.name
		})
	}
}

// TestDerivedNameIsNeverTheBase: for bases that are themselves long
// derived names, and for every length of base, the derived name is a
// different name that PostgreSQL keeps whole.
func TestDerivedNameIsNeverTheBase(t *testing.T) {
	for _, suffix := range []string{"__shadow", "_sale_date", "_" + name(t, "c", 'c', 63)} {
		for n := 1; n <= maxIdentLen; n++ {
			for _, base := range []string{name(t, "", 'a', n), derivedName(name(t, "", 'a', n), suffix)} {
				got := derivedName(base, suffix)
				if got == base || len(got) > maxIdentLen {
					t.Errorf("derivedName(%q, %q) = %q", base, suffix, got)
				}
			}
		}
	}
}

func TestShadowName(t *testing.T) {
	tests := []struct {
		name   string
		target []string
		want   string
	}{
		{"short", []string{"public", "daily_sales"}, `"public"."daily_sales__shadow"`},
		{"schema kept", []string{"reports", "daily_sales"}, `"reports"."daily_sales__shadow"`},
		{"63 bytes", []string{"reports", "daily_sales_yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"},
			`"reports"."daily_sales_yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy_541ea9ea__shadow"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Definition{Target: tt.target, Calendar: Calendar{Day, time.UTC}}
			if got := d.ShadowName().Sanitize(); got != tt.want {
				t.Errorf("ShadowName() = %s, want %s", got, tt.want)
			}
			if d.Target[1] != tt.target[1] {
				t.Errorf("ShadowName changed the target to %v", d.Target)
			}
		})
	}
}
