package decode

import "time"

// AdvanceCacheClock moves the clock of schema cache expiries by d for the
// rest of the test.
func AdvanceCacheClock(tb interface{ Cleanup(func()) }, d time.Duration) {
	prev := cacheClock
	cacheClock = func() time.Time { return prev().Add(d) }
	tb.Cleanup(func() { cacheClock = prev })
}
