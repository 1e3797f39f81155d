package ingesttest

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// Scalar runs a query returning one integer.
func Scalar(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// StoredOffsets returns the next offsets the warehouse holds for a topic;
// none while the warehouse has not been migrated yet.
func StoredOffsets(tb testing.TB, pool *pgxpool.Pool, group, topic string) map[int32]int64 {
	tb.Helper()
	out := map[int32]int64{}
	if Scalar(tb, pool, "SELECT (to_regclass('tidemark.kafka_offsets') IS NOT NULL)::int") == 0 {
		return out
	}
	rows, err := pool.Query(context.Background(),
		"SELECT partition, next_offset FROM tidemark.kafka_offsets WHERE consumer_group = $1 AND topic = $2", group, topic)
	if err != nil {
		tb.Fatalf("read offsets: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			tb.Fatalf("read offsets: %v", err)
		}
		out[p] = o
	}
	return out
}

// WaitStored waits up to timeout until the stored offsets reach end for
// every partition.
func WaitStored(tb testing.TB, pool *pgxpool.Pool, group, topic string, end map[int32]int64, timeout time.Duration) {
	tb.Helper()
	var stored map[int32]int64
	if err := waitfor.Poll(timeout, func() bool {
		stored = StoredOffsets(tb, pool, group, topic)
		for p, e := range end {
			if stored[p] < e {
				return false
			}
		}
		return true
	}); err != nil {
		tb.Fatalf("stored offsets %v did not reach %v within %s", stored, end, timeout)
	}
}

// AssertStoredEqual checks that the stored offsets equal end exactly.
func AssertStoredEqual(tb testing.TB, pool *pgxpool.Pool, group, topic string, end map[int32]int64) {
	tb.Helper()
	stored := StoredOffsets(tb, pool, group, topic)
	for part, e := range end {
		if stored[part] != e {
			tb.Errorf("partition %d: stored offset %d, end offset %d", part, stored[part], e)
		}
	}
}

// AssertRaw checks that raw.<source> holds exactly the ids in want, each
// once.
func AssertRaw(tb testing.TB, pool *pgxpool.Pool, source string, want map[string]bool) {
	tb.Helper()
	rows, err := pool.Query(context.Background(), "SELECT event_id FROM raw."+source)
	if err != nil {
		tb.Fatalf("read raw: %v", err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			tb.Fatalf("read raw: %v", err)
		}
		got[id]++
	}
	if d := Compare(want, got); d.Len() > 0 {
		tb.Fatalf("raw.%s differs from the produced set: %s", source, d)
	}
}

// Difference is how stored ids differ from the ids that should be stored
// once each, every list sorted.
type Difference struct {
	Missing, Doubled, Extra []string
}

// Compare returns how got, the number of times each id is stored,
// differs from want, the ids that must be stored exactly once.
func Compare[V any](want map[string]V, got map[string]int) Difference {
	var d Difference
	for id := range want {
		switch got[id] {
		case 0:
			d.Missing = append(d.Missing, id)
		case 1:
		default:
			d.Doubled = append(d.Doubled, id)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			d.Extra = append(d.Extra, id)
		}
	}
	sort.Strings(d.Missing)
	sort.Strings(d.Doubled)
	sort.Strings(d.Extra)
	return d
}

// Len is the number of ids that differ.
func (d Difference) Len() int { return len(d.Missing) + len(d.Doubled) + len(d.Extra) }

// String shows the counts and the first few ids of each kind.
func (d Difference) String() string {
	return fmt.Sprintf("%d missing %v, %d doubled %v, %d unexpected %v",
		len(d.Missing), Head(d.Missing), len(d.Doubled), Head(d.Doubled), len(d.Extra), Head(d.Extra))
}

// Head is the first five elements of s, for messages.
func Head(s []string) []string { return s[:min(len(s), 5)] }

// AssertDeadLetters checks that tidemark.dead_letters holds exactly the bad
// records of w, once each, with their reason, value bytes, first header and
// coordinates.
func AssertDeadLetters(tb testing.TB, pool *pgxpool.Pool, w *Workload) {
	tb.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT record_key, record_value, reason, header_keys[1], header_values[1], topic, partition, "offset" FROM tidemark.dead_letters`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var key, value, hk, hv []byte
		var reason, topic string
		var part int32
		var off int64
		if err := rows.Scan(&key, &value, &reason, &hk, &hv, &topic, &part, &off); err != nil {
			tb.Fatal(err)
		}
		want, ok := w.Bad[string(key)]
		switch {
		case !ok:
			tb.Errorf("unexpected dead letter key=%q reason=%s", key, reason)
		case seen[string(key)]:
			tb.Errorf("dead letter %q stored twice", key)
		case reason != want.Reason:
			tb.Errorf("dead letter %q: reason %s, want %s", key, reason, want.Reason)
		case !bytes.Equal(value, want.Value):
			tb.Errorf("dead letter %q: value changed: %q", key, value)
		case string(hk) != "trace" || string(hv) != "t-"+string(key):
			tb.Errorf("dead letter %q: header %q=%q", key, hk, hv)
		case off < 0 || part < 0:
			tb.Errorf("dead letter %q: coordinates %s/%d/%d", key, topic, part, off)
		}
		seen[string(key)] = true
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	if len(seen) != len(w.Bad) {
		tb.Errorf("dead letters: %d, want %d", len(seen), len(w.Bad))
	}
}

// AssertLedger checks that the ledger's row counts for source sum to the
// raw row count and that every ledger row's event times lie in its hour.
func AssertLedger(tb testing.TB, pool *pgxpool.Pool, source string) {
	tb.Helper()
	raw := Scalar(tb, pool, "SELECT count(*) FROM raw."+source)
	ledger := Scalar(tb, pool, "SELECT coalesce(sum(rows), 0)::bigint FROM tidemark.ingest_ledger WHERE source = $1", source)
	if ledger != raw {
		tb.Errorf("ledger rows %d, raw rows %d", ledger, raw)
	}
	bad := Scalar(tb, pool, `SELECT count(*) FROM tidemark.ingest_ledger
		WHERE min_event_time < bucket OR max_event_time >= bucket + interval '1 hour' OR min_event_time > max_event_time`)
	if bad != 0 {
		tb.Errorf("%d ledger rows with event times outside their bucket", bad)
	}
}
