package aggregate

import (
	"strings"
	"testing"
	"time"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestCalendar(t *testing.T) {
	ny, kolkata := mustLoc(t, "America/New_York"), mustLoc(t, "Asia/Kolkata")
	tests := []struct {
		name       string
		cal        Calendar
		at         string
		start, end string
		label      string
		hours      float64
	}{
		{"utc day", Calendar{Day, time.UTC}, "2026-10-04T23:30:00Z", "2026-10-04T00:00:00Z", "2026-10-05T00:00:00Z", "2026-10-04", 24},
		{"new york day before fall back", Calendar{Day, ny}, "2026-11-01T03:59:00Z", "2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z", "2026-10-31", 24},
		{"new york fall-back day (25h)", Calendar{Day, ny}, "2026-11-01T04:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", "2026-11-01", 25},
		{"new york fall-back day, its last minute", Calendar{Day, ny}, "2026-11-02T04:59:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", "2026-11-01", 25},
		{"new york spring-forward day (23h)", Calendar{Day, ny}, "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", "2026-03-08", 23},
		{"first 01:00 hour of the fall-back night", Calendar{Hour, ny}, "2026-11-01T05:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T01:00-04:00", 1},
		{"second 01:00 hour of the fall-back night", Calendar{Hour, ny}, "2026-11-01T06:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T01:00-05:00", 1},
		{"half-hour zone hour", Calendar{Hour, kolkata}, "2026-10-04T18:45:00Z", "2026-10-04T18:30:00Z", "2026-10-04T19:30:00Z", "2026-10-05T00:00+05:30", 1},
		{"half-hour zone day", Calendar{Day, kolkata}, "2026-10-04T18:29:00Z", "2026-10-03T18:30:00Z", "2026-10-04T18:30:00Z", "2026-10-04", 24},
		{"month", Calendar{Month, ny}, "2026-11-15T00:00:00Z", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", "2026-11", 30*24 + 1},
		{"month in December", Calendar{Month, time.UTC}, "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2026-12", 31 * 24},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.cal.Of(utc(tt.at))
			if !p.Start.Equal(utc(tt.start)) || !p.End.Equal(utc(tt.end)) {
				t.Errorf("Of(%s) = [%s, %s), want [%s, %s)", tt.at, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339), tt.start, tt.end)
			}
			if p.Label() != tt.label {
				t.Errorf("label %q, want %q", p.Label(), tt.label)
			}
			if h := p.End.Sub(p.Start).Hours(); h != tt.hours {
				t.Errorf("partition lasts %vh, want %vh", h, tt.hours)
			}
			if again := tt.cal.At(p.Start); again != p {
				t.Errorf("At(start) = %v, want %v", again, p)
			}
		})
	}
}

func TestOverlapping(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	cal := Calendar{Day, ny}
	// A UTC hour bucket that straddles New York midnight maps onto both days.
	got := cal.Overlapping(utc("2026-10-05T03:10:00Z"), utc("2026-10-05T04:20:00Z"))
	if len(got) != 2 || got[0].Label() != "2026-10-04" || got[1].Label() != "2026-10-05" {
		t.Errorf("Overlapping = %v", got)
	}
	if got := cal.Overlapping(utc("2026-10-05T05:00:00Z"), utc("2026-10-05T05:59:00Z")); len(got) != 1 {
		t.Errorf("Overlapping within a day = %v", got)
	}
}

func TestQueryRewrite(t *testing.T) {
	d := &Definition{Name: "agg", Raw: []string{"raw", "src"}, EventTime: "event_time", IngestedAt: "ingested_at",
		Calendar: Calendar{Day, time.UTC}, Horizon: 72 * time.Hour, Policy: Correction}
	p := d.Of(utc("2026-10-04T12:00:00Z"))
	tests := []struct{ name, sql, user string }{
		{"select", "SELECT {{partition}} AS d, count(*) AS n FROM {{events}} GROUP BY 1",
			"SELECT '2026-10-04'::date AS d, count(*) AS n FROM events GROUP BY 1"},
		{"with", "with x AS (SELECT 1) SELECT {{partition}} AS d FROM {{events}}, x",
			"with x AS (SELECT 1) SELECT '2026-10-04'::date AS d FROM events, x"},
		{"with recursive", "WITH RECURSIVE r AS (SELECT 1) SELECT {{partition}} AS d FROM {{events}}",
			"WITH RECURSIVE r AS (SELECT 1) SELECT '2026-10-04'::date AS d FROM events"},
		{"trailing line comment", "SELECT {{partition}} AS d FROM {{events}} -- one row",
			"SELECT '2026-10-04'::date AS d FROM events -- one row"},
		{"leading comment", "-- {{events}} of a day\nWITH x AS (SELECT 1) SELECT {{partition}} AS d FROM {{events}}, x",
			"-- events of a day\nWITH x AS (SELECT 1) SELECT '2026-10-04'::date AS d FROM events, x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d.SQL = tt.sql
			q := d.query(p)
			// The user's SQL, on lines of its own inside a subquery, is
			// followed by nothing a comment could swallow.
			if want := "\nSELECT * FROM (\n" + tt.user + "\n) AS tidemark_query"; !strings.HasPrefix(q, "WITH events AS (SELECT * FROM ") || !strings.HasSuffix(q, want) {
				t.Errorf("query(%q) =\n%s\nwant it to end\n%s", tt.sql, q, want)
			}
			for _, want := range []string{`"event_time" >= '2026-10-04 00:00:00+00'::timestamptz`,
				`"event_time" < '2026-10-05 00:00:00+00'::timestamptz`, `"ingested_at" <= '2026-10-08 00:00:00+00'::timestamptz`} {
				if !strings.Contains(q, want) {
					t.Errorf("query(%q) lacks %s:\n%s", tt.sql, want, q)
				}
			}
		})
	}
}
