package aggregate

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones of every machine, so that no input is skipped
)

// fuzzZones are the time zones FuzzCalendar draws from: daylight saving
// time, half- and quarter-hour offsets, a 30-minute DST shift (Lord Howe),
// clocks that change at midnight (Havana, Santiago, Beirut, Asuncion), a
// zone that skipped a whole day (Apia) and one whose DST follows Ramadan
// (Casablanca).
var fuzzZones = []string{
	"UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe",
	"Asia/Kathmandu", "America/St_Johns", "Pacific/Chatham", "Africa/Casablanca",
	"America/Havana", "America/Santiago", "Asia/Beirut", "America/Asuncion",
	"Pacific/Apia", "Asia/Kolkata",
}

// fuzzGrains are the partition granularities.
var fuzzGrains = []string{Hour, Day, Month}

// fuzzSpan is the range of instants FuzzCalendar maps its input onto:
// 1850 to 2250, before time zones were standardised and past the last
// transition the zone files list.
var (
	fuzzFrom = time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	fuzzTo   = time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
)

// FuzzCalendar checks Calendar.Of for any instant, zone and granularity.
// Property: the instant lands in exactly one partition: start <= t < end,
// the partition is not empty, the next partition starts at its end and the
// previous one ends at its start, At(start) gives the same partition, and
// the partition's start has t's local date (day), year and month (month),
// or local hour and offset (hour).
func FuzzCalendar(f *testing.F) {
	f.Add(time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC).Unix(), int64(0), uint8(1), uint8(0))   // New York fall back, hour
	f.Add(time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(1), uint8(1))     // New York spring forward, day
	f.Add(time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(2), uint8(0))    // London spring forward
	f.Add(time.Date(2026, 10, 3, 15, 30, 0, 0, time.UTC).Unix(), int64(0), uint8(3), uint8(0))  // Lord Howe spring forward (30 minutes)
	f.Add(time.Date(2026, 4, 4, 15, 0, 0, 0, time.UTC).Unix(), int64(1), uint8(3), uint8(0))    // Lord Howe fall back
	f.Add(time.Date(1986, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(4), uint8(0))     // Kathmandu +05:30 to +05:45
	f.Add(time.Date(2026, 9, 26, 14, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(6), uint8(1))   // Chatham spring forward
	f.Add(time.Date(2026, 2, 15, 2, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(7), uint8(1))    // Casablanca, Ramadan
	f.Add(time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(8), uint8(1))     // Havana spring forward at midnight
	f.Add(time.Date(2026, 11, 1, 5, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(8), uint8(1))    // Havana fall back to midnight
	f.Add(time.Date(2026, 9, 6, 4, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(9), uint8(2))     // Santiago spring forward at midnight, month
	f.Add(time.Date(2011, 12, 30, 10, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(12), uint8(1)) // Apia skips 30 December 2011
	f.Add(time.Date(1883, 11, 18, 17, 0, 0, 0, time.UTC).Unix(), int64(0), uint8(1), uint8(0))  // New York leaves local mean time
	f.Fuzz(func(t *testing.T, sec, nsec int64, zone, grain uint8) {
		loc, err := time.LoadLocation(fuzzZones[int(zone)%len(fuzzZones)])
		if err != nil {
			t.Fatal(err) // time/tzdata is embedded: every zone loads
		}
		cal := Calendar{By: fuzzGrains[int(grain)%len(fuzzGrains)], Loc: loc}
		// Instants in the span stay as they are; others are folded in.
		span := fuzzTo - fuzzFrom
		off := (sec%span - fuzzFrom%span + 2*span) % span
		at := time.Unix(fuzzFrom+off, ((nsec%1e9)+1e9)%1e9).UTC()
		checkPartition(t, cal, at)
	})
}

// checkPartition checks FuzzCalendar's property for one instant.
func checkPartition(t *testing.T, cal Calendar, at time.Time) {
	t.Helper()
	p := cal.Of(at)
	show := func(p Partition) string {
		return "[" + p.Start.In(cal.Loc).Format(time.RFC3339Nano) + ", " + p.End.In(cal.Loc).Format(time.RFC3339Nano) + ")"
	}
	where := cal.By + " in " + cal.Loc.String() + " at " + at.Format(time.RFC3339Nano) + " (" + at.In(cal.Loc).Format(time.RFC3339Nano) + ")"
	if !p.End.After(p.Start) {
		t.Fatalf("%s: empty partition %s", where, show(p))
	}
	if at.Before(p.Start) || !at.Before(p.End) {
		t.Fatalf("%s: partition %s does not hold the instant", where, show(p))
	}
	if next := cal.Of(p.End); !next.Start.Equal(p.End) {
		t.Fatalf("%s: partition %s is followed by %s", where, show(p), show(next))
	}
	if prev := cal.Of(p.Start.Add(-time.Nanosecond)); !prev.End.Equal(p.Start) {
		t.Fatalf("%s: partition %s is preceded by %s", where, show(p), show(prev))
	}
	if again := cal.At(p.Start); again != p {
		t.Fatalf("%s: At(start) = %s, want %s", where, show(again), show(p))
	}
	l, s := at.In(cal.Loc), p.Start.In(cal.Loc)
	switch cal.By {
	case Hour:
		_, lo := l.Zone()
		_, so := s.Zone()
		if p.End.Sub(p.Start) > time.Hour || l.Hour() != s.Hour() || lo != so {
			t.Fatalf("%s: hour partition %s is not the instant's local hour", where, show(p))
		}
	case Day:
		if l.Year() != s.Year() || l.YearDay() != s.YearDay() {
			t.Fatalf("%s: day partition %s starts on another local date", where, show(p))
		}
	case Month:
		if l.Year() != s.Year() || l.Month() != s.Month() {
			t.Fatalf("%s: month partition %s starts in another local month", where, show(p))
		}
	}
}
