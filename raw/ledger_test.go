package raw

import (
	"testing"
	"time"
)

// TestLedgerCounts: rows added one by one and hours added whole fold into
// one entry per source and UTC hour, with the least and greatest event
// time, and Reset empties the ledger.
func TestLedgerCounts(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var l Ledger
	l.Add("a", at("2026-10-05T09:30:00Z"))
	l.Add("a", at("2026-10-05T09:10:00Z"))
	l.Add("b", at("2026-10-05T09:20:00Z"))
	l.Add("a", at("2026-10-05T09:50:00+02:00")) // 07:50 UTC
	l.AddHour("a", at("2026-10-05T09:00:00Z"), 5, at("2026-10-05T09:05:00Z"), at("2026-10-05T09:55:00Z"))
	if l.Len() != 3 {
		t.Fatalf("Len = %d, want 3", l.Len())
	}
	args := l.args(at("2026-10-06T00:00:00Z"))
	sources, hours, counts := args[1].([]string), args[2].([]time.Time), args[3].([]int64)
	mins, maxes := args[4].([]time.Time), args[5].([]time.Time)
	type row struct {
		rows     int64
		min, max string
	}
	got := map[string]row{}
	for i := range sources {
		got[sources[i]+" "+hours[i].Format(time.RFC3339)] = row{counts[i], mins[i].UTC().Format(time.RFC3339), maxes[i].UTC().Format(time.RFC3339)}
	}
	want := map[string]row{
		"a 2026-10-05T09:00:00Z": {7, "2026-10-05T09:05:00Z", "2026-10-05T09:55:00Z"},
		"a 2026-10-05T07:00:00Z": {1, "2026-10-05T07:50:00Z", "2026-10-05T07:50:00Z"},
		"b 2026-10-05T09:00:00Z": {1, "2026-10-05T09:20:00Z", "2026-10-05T09:20:00Z"},
	}
	if len(got) != len(want) {
		t.Fatalf("ledger rows = %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("ledger row %s = %+v, want %+v", k, got[k], w)
		}
	}
	if h := l.Hours("b"); len(h) != 1 || !h[0].Equal(at("2026-10-05T09:00:00Z")) {
		t.Errorf("Hours(b) = %v, want [09:00]", h)
	}
	l.Reset()
	if l.Len() != 0 || len(l.Hours("a")) != 0 {
		t.Errorf("after Reset: Len = %d, Hours(a) = %v", l.Len(), l.Hours("a"))
	}
	l.Add("a", at("2026-10-05T10:00:00Z"))
	if l.Len() != 1 {
		t.Errorf("Len after Reset and Add = %d, want 1", l.Len())
	}
}
