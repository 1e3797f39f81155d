// Package history simulates weeks of sales events that arrive late in a
// realistic mix — most within minutes, some hours or a day later, a few
// after days — for the demo and the tests of the status page: enough
// final partitions for an arrival curve and a completeness estimate, and
// events beyond a 72-hour horizon.
package history

import (
	"fmt"
	"slices"
	"time"
)

// Event is one simulated sale: it happened At and reaches Kafka at
// Arrives.
type Event struct {
	ID      string
	At      time.Time
	Arrives time.Time
	Amount  string
}

// JSON is the event as the demo's producers write it.
func (e Event) JSON() []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_time":%q,"amount":%q}`, e.ID, e.At.Format(time.RFC3339), e.Amount)
}

// delays is the arrival delay of successive events: half within the hour,
// most of the rest within a day, and one in twelve after more than three
// days.
var delays = []time.Duration{
	10 * time.Minute, 25 * time.Minute, 40 * time.Minute, 2 * time.Hour, 10 * time.Minute, 5 * time.Hour,
	15 * time.Minute, 14 * time.Hour, 50 * time.Minute, 26 * time.Hour, 3 * time.Hour, 85 * time.Hour,
}

// Step is the resolution of arrival times: events arrive in batches at
// whole multiples of it, which keeps the number of produce steps small.
const Step = 3 * time.Hour

// Sales returns perDay events a day, evenly spread over each day of
// [from, to) in UTC, that arrive by now, ordered by arrival. IDs start with
// prefix.
func Sales(prefix string, from, to, now time.Time, perDay int) []Event {
	var out []Event
	n := 0
	for day := from; day.Before(to); day = day.AddDate(0, 0, 1) {
		for i := range perDay {
			at := day.Add(time.Duration(i) * 24 * time.Hour / time.Duration(perDay)).Add(17 * time.Minute)
			arrives := at.Add(delays[n%len(delays)])
			if r := arrives.Truncate(Step); r.Before(arrives) {
				arrives = r.Add(Step)
			}
			n++
			if at.After(now) || arrives.After(now) {
				continue
			}
			out = append(out, Event{ID: fmt.Sprintf("%s%04d", prefix, n), At: at, Arrives: arrives,
				Amount: fmt.Sprintf("%d.%02d", 5+n%40, n%100)})
		}
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Arrives.Compare(b.Arrives) })
	return out
}

// Batches groups events (ordered by arrival) by arrival time.
func Batches(evs []Event) [][]Event {
	var out [][]Event
	for i, e := range evs {
		if i == 0 || !e.Arrives.Equal(evs[i-1].Arrives) {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], e)
	}
	return out
}
