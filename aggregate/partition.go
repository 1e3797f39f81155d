package aggregate

import (
	"time"
)

// Granularities of aggregate partitions.
const (
	Hour  = "hour"
	Day   = "day"
	Month = "month"
)

// Partition is one event-time partition of an aggregate: the instants
// [Start, End) in its time zone's calendar. A day in a time zone with
// daylight saving time lasts 23 or 25 hours on the days the clocks change.
type Partition struct {
	Start, End time.Time
	by         string
	loc        *time.Location
}

// Key is the value of the partition column and of {{partition}}: the
// local date for day and month partitions (midnight UTC of that date, as
// pgx encodes dates from the date fields), the start instant for hours.
func (p Partition) Key() time.Time {
	if p.by == Hour {
		return p.Start
	}
	l := p.Start.In(p.loc)
	return time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, time.UTC)
}

// Label names the partition for people: 2026-10-04, 2026-10, or
// 2026-11-01T01:00-04:00 for hours.
func (p Partition) Label() string {
	l := p.Start.In(p.loc)
	switch p.by {
	case Month:
		return l.Format("2006-01")
	case Hour:
		return l.Format("2006-01-02T15:04Z07:00")
	}
	return l.Format("2006-01-02")
}

// String implements fmt.Stringer.
func (p Partition) String() string { return p.Label() }

// keyLiteral is the partition key as a typed SQL literal.
func (p Partition) keyLiteral() string {
	if p.by == Hour {
		return timeLiteral(p.Start)
	}
	return "'" + p.Key().Format("2006-01-02") + "'::date"
}

func timeLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'::timestamptz"
}

// Calendar computes the partitions of one granularity in one time zone.
type Calendar struct {
	By  string
	Loc *time.Location
}

// Of returns the partition holding the instant t.
func (c Calendar) Of(t time.Time) Partition {
	l := t.In(c.Loc)
	var start, end time.Time
	switch c.By {
	case Hour:
		// The local hour that contains t, as instants: subtracting the
		// minutes and seconds past the local hour works for every offset
		// (half-hour zones included) and keeps the two 01:00 hours of a
		// night the clocks go back apart. A change of offset that is not
		// a whole hour (Lord Howe's daylight saving time moves the clocks
		// by 30 minutes) ends one local hour and starts the next mid-hour:
		// the partition ends and starts there, so that the partitions of
		// the hours around it do not overlap.
		start = t.Add(-time.Duration(l.Minute())*time.Minute - time.Duration(l.Second())*time.Second -
			time.Duration(l.Nanosecond()))
		end = start.Add(time.Hour)
		zoneStart, zoneEnd := l.ZoneBounds()
		if !zoneStart.IsZero() && zoneStart.After(start) {
			start = zoneStart
		}
		if !zoneEnd.IsZero() && zoneEnd.Before(end) {
			end = zoneEnd
		}
	case Month:
		start = c.midnight(l.Year(), l.Month(), 1)
		end = c.midnight(l.Year(), l.Month()+1, 1)
	default:
		start = c.midnight(l.Year(), l.Month(), l.Day())
		end = c.midnight(l.Year(), l.Month(), l.Day()+1)
	}
	return Partition{Start: start.UTC(), End: end.UTC(), by: c.By, loc: c.Loc}
}

// midnight returns the first instant of the local date (normalised as
// time.Date does) or, when the zone skipped that date, of the first date
// after it. time.Date alone is not enough: where the clocks go forward at
// midnight (Havana, Santiago, Asuncion) local midnight does not exist and
// time.Date may return an instant of the day before, where they go back
// to midnight the first midnight may not be the one it picks, and Apia
// skipped 30 December 2011 altogether.
func (c Calendar) midnight(y int, m time.Month, d int) time.Time {
	at := time.Date(y, m, d, 0, 0, 0, 0, c.Loc)
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // normalised
	on := func(t time.Time) bool {                   // t's local date is want or later
		l := t.In(c.Loc)
		return !time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, time.UTC).Before(want)
	}
	if on(at) && !on(at.Add(-time.Nanosecond)) {
		return at
	}
	// Local dates only move forward within two days of at: the earliest
	// instant on the date or later lies between these bounds.
	lo, hi := at.Add(-48*time.Hour), at.Add(48*time.Hour)
	for hi.Sub(lo) > time.Nanosecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if on(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// At returns the partition that starts at start (as stored).
func (c Calendar) At(start time.Time) Partition { return c.Of(start) }

// Overlapping returns the partitions that hold an instant of [lo, hi], in
// order. Callers pass short ranges (a ledger row spans one hour).
func (c Calendar) Overlapping(lo, hi time.Time) []Partition {
	var out []Partition
	for p := c.Of(lo); !p.Start.After(hi); p = c.Of(p.End) {
		out = append(out, p)
	}
	return out
}
