package backfill

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/aggregate"
)

// TestChunks: the plan's half-open chunks cover the range's partitions,
// whole, in order, one calendar span each (the lesson's backfill_plan,
// which gives 2026-09-01 .. 2026-09-04 as four one-day chunks).
func TestChunks(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	date := func(s string) time.Time {
		d, err := time.Parse("2006-01-02", s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name     string
		by       string
		loc      *time.Location
		from, to string
		span     time.Duration
		want     []string // chunk labels
		first    string   // first chunk's [start, end) in UTC, when checked
	}{
		{name: "days, one a chunk", by: aggregate.Day, loc: time.UTC, from: "2026-09-01", to: "2026-09-04", span: 24 * time.Hour,
			want: []string{"2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"}, first: "2026-09-01T00:00:00Z 2026-09-02T00:00:00Z"},
		{name: "days, two a chunk", by: aggregate.Day, loc: time.UTC, from: "2026-09-01", to: "2026-09-05", span: 48 * time.Hour,
			want: []string{"2026-09-01 .. 2026-09-02", "2026-09-03 .. 2026-09-04", "2026-09-05"}},
		{name: "one day", by: aggregate.Day, loc: time.UTC, from: "2026-09-01", to: "2026-09-01", span: 7 * 24 * time.Hour,
			want: []string{"2026-09-01"}},
		{name: "to before from", by: aggregate.Day, loc: time.UTC, from: "2026-09-02", to: "2026-09-01", span: 24 * time.Hour},
		{name: "a 25-hour day is one chunk of 1d", by: aggregate.Day, loc: ny, from: "2026-10-31", to: "2026-11-02", span: 24 * time.Hour,
			want: []string{"2026-10-31", "2026-11-01", "2026-11-02"}},
		{name: "a week across the DST change", by: aggregate.Day, loc: ny, from: "2026-10-28", to: "2026-11-10", span: 7 * 24 * time.Hour,
			want: []string{"2026-10-28 .. 2026-11-03", "2026-11-04 .. 2026-11-10"}},
		{name: "hours, six a chunk", by: aggregate.Hour, loc: time.UTC, from: "2026-09-01", to: "2026-09-01", span: 6 * time.Hour,
			want: []string{"2026-09-01T00:00Z .. 2026-09-01T05:00Z", "2026-09-01T06:00Z .. 2026-09-01T11:00Z",
				"2026-09-01T12:00Z .. 2026-09-01T17:00Z", "2026-09-01T18:00Z .. 2026-09-01T23:00Z"}},
		{name: "months hold whole months", by: aggregate.Month, loc: time.UTC, from: "2026-08-31", to: "2026-09-01", span: 24 * time.Hour,
			want: []string{"2026-08", "2026-09"}, first: "2026-08-01T00:00:00Z 2026-09-01T00:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &aggregate.Definition{Name: "a", Calendar: aggregate.Calendar{By: tc.by, Loc: tc.loc}}
			got := chunks(d, Range{From: date(tc.from), To: date(tc.to)}, tc.span)
			var labels []string
			for i, c := range got {
				labels = append(labels, c.Label())
				if !c.Start.Equal(c.Partitions[0].Start) || !c.End.Equal(c.Partitions[len(c.Partitions)-1].End) {
					t.Errorf("chunk %s is [%s, %s), not its partitions' bounds", c.Label(), c.Start, c.End)
				}
				if i > 0 && !c.Start.Equal(got[i-1].End) {
					t.Errorf("chunk %s does not start where %s ends", c.Label(), got[i-1].Label())
				}
			}
			if strings.Join(labels, ",") != strings.Join(tc.want, ",") {
				t.Errorf("chunks %q, want %q", labels, tc.want)
			}
			if tc.first != "" {
				if b := got[0].Start.UTC().Format(time.RFC3339) + " " + got[0].End.UTC().Format(time.RFC3339); b != tc.first {
					t.Errorf("first chunk [%s), want [%s)", b, tc.first)
				}
			}
		})
	}
}

// TestChunkFault: a chunk the warehouse refuses is recorded and the run goes
// on; a warehouse that cannot be reached or is shutting down stops it.
func TestChunkFault(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: pgerrcode.UniqueViolation}, true},
		{&pgconn.PgError{Code: pgerrcode.InvalidTextRepresentation}, true},
		{&pgconn.PgError{Code: pgerrcode.DeadlockDetected}, true}, // after its retries
		{&pgconn.PgError{Code: pgerrcode.QueryCanceled}, true},    // statement timeout
		{fmt.Errorf("rebuild: %w", aggregate.ErrOutsidePartition), true},
		{fmt.Errorf("publish: %w", ErrNoShadow), true},
		{&pgconn.PgError{Code: pgerrcode.AdminShutdown}, false},
		{&pgconn.PgError{Code: pgerrcode.ConnectionFailure}, false},
		{&pgconn.PgError{Code: pgerrcode.TooManyConnections}, false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		if got := chunkFault(tc.err); got != tc.want {
			t.Errorf("chunkFault(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
