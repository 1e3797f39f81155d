package kafka_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
)

// event is a record of the tests' topic with the given id and raw JSON
// event time.
func event(topic, id, eventTime string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(id),
		Headers: []kgo.RecordHeader{{Key: "origin", Value: []byte("replay-test")}},
		Value:   fmt.Appendf(nil, `{"event_id":%q,"event_time":%s,"n":1}`, id, eventTime)}
}

// rfc3339 is t as a JSON string in RFC 3339.
func rfc3339(t time.Time) string { return `"` + t.UTC().Format(time.RFC3339) + `"` }

// ingestAll produces recs, runs an ingester with b's configuration until
// it has stored them, and stops it.
func (b *bundle) ingestAll(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
}

// replay runs kafka.Replay over app_events with b's configuration, on the
// service clock of the tests.
func (b *bundle) replay(t *testing.T, opts kafka.ReplayOptions) kafka.ReplayReport {
	t.Helper()
	ctx := context.Background()
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	opts.Source, opts.Now = "app_events", b.clock.Now
	rep, err := kafka.Replay(ctx, c.Conn(), kafka.ConfigFrom(b.config(t)), opts)
	if err != nil {
		t.Fatalf("replay (dry run %v): %v", opts.DryRun, err)
	}
	return rep
}

// checkReport compares what a replay reports with what a test expects.
func checkReport(t *testing.T, what string, rep kafka.ReplayReport, loaded, stored int, failing map[string]int) {
	t.Helper()
	if rep.Loaded != loaded || rep.AlreadyStored != stored || !maps.Equal(rep.Failing, failing) {
		t.Errorf("%s: loaded %d, already stored %d, failing %v; want %d, %d, %v",
			what, rep.Loaded, rep.AlreadyStored, rep.Failing, loaded, stored, failing)
	}
}

// rawIDs is the event ids of raw.app_events, with how often each is there.
func rawIDs(t *testing.T, b *bundle) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT event_id FROM raw.app_events")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// assertRawIDs checks that raw.app_events holds each id of want once and
// nothing else.
func assertRawIDs(t *testing.T, b *bundle, want map[string]bool) {
	t.Helper()
	if d := ingesttest.Compare(want, rawIDs(t, b)); d.Len() > 0 {
		t.Errorf("raw.app_events: %s", d)
	}
}

// ledgerOffRawSQL counts the differences between the ledger of app_events
// and its raw rows grouped as the ledger groups them: by load transaction
// and UTC hour of event time, with counts and least and greatest event
// time. The reconciler reads exactly these ledger rows.
const ledgerOffRawSQL = `
WITH r AS (SELECT load_xid::text AS xid, date_bin('1 hour', event_time, '2000-01-01 00:00+00') AS bucket,
                  count(*) AS n, min(event_time) AS lo, max(event_time) AS hi
           FROM raw.app_events GROUP BY 1, 2),
     l AS (SELECT load_xid::text, bucket, rows, min_event_time, max_event_time
           FROM tidemark.ingest_ledger WHERE source = 'app_events')
SELECT count(*) FROM ((SELECT * FROM r EXCEPT ALL SELECT * FROM l) UNION ALL (SELECT * FROM l EXCEPT ALL SELECT * FROM r)) d`

// replayedSQL lists the keys of the dead letters of app_events marked
// replayed.
const replayedSQL = `SELECT count(*) FROM tidemark.dead_letters WHERE source = 'app_events' AND replayed_at IS NOT NULL`

// TestReplayLoadsWhatNowDecodes: records that became dead letters under
// one configuration are loaded by a replay under a corrected one, once,
// with ledger rows that match them; those that still fail stay as they
// were, reported by reason; a dry run first writes nothing, and a second
// replay loads nothing.
func TestReplayLoadsWhatNowDecodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ingest and fix set the bundle's configuration for ingesting
		// and for the replay.
		ingest, fix           func(b *bundle)
		good, fixable, broken func(i int) string // raw JSON event times
		failing               map[string]int
	}{{
		name:    "max_age widened",
		ingest:  func(b *bundle) { b.maxAge = "1d" },
		fix:     func(b *bundle) { b.maxAge = "30d" },
		good:    func(i int) string { return rfc3339(testNow.Add(-time.Duration(i) * time.Minute)) },
		fixable: func(i int) string { return rfc3339(testNow.Add(-72*time.Hour - time.Duration(i)*time.Hour)) },
		broken:  func(i int) string { return rfc3339(testNow.AddDate(0, 0, -60-i)) },
		failing: map[string]int{decode.ReasonTimeOutOfRange: 5, decode.ReasonMissingID: 1},
	}, {
		name:    "event_time_format corrected",
		ingest:  func(b *bundle) { b.yaml = "    event_time_format: unix_seconds\n" },
		fix:     func(b *bundle) { b.yaml = "    event_time_format: auto\n" },
		good:    func(i int) string { return fmt.Sprint(testNow.Add(-time.Duration(i) * time.Minute).Unix()) },
		fixable: func(i int) string { return rfc3339(testNow.Add(-time.Duration(i) * 5 * time.Minute)) },
		broken:  func(i int) string { return `"yesterday"` },
		failing: map[string]int{decode.ReasonInvalidTime: 5, decode.ReasonMissingID: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, 1)
			tc.ingest(b)
			var recs []*kgo.Record
			good, fixable := map[string]bool{}, map[string]bool{}
			for i := range 20 {
				id := fmt.Sprintf("good-%d", i)
				good[id] = true
				recs = append(recs, event(b.topic, id, tc.good(i)))
			}
			for i := range 23 {
				id := fmt.Sprintf("fixable-%d", i)
				fixable[id] = true
				recs = append(recs, event(b.topic, id, tc.fixable(i)))
			}
			for i := range 5 {
				recs = append(recs, event(b.topic, fmt.Sprintf("broken-%d", i), tc.broken(i)))
			}
			recs = append(recs, &kgo.Record{Topic: b.topic, Value: []byte(`{"event_time":"2026-10-05T11:00:00Z"}`)})
			b.ingestAll(t, recs)
			assertRawIDs(t, b, good)
			rawBefore := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events")
			ledgerBefore := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.ingest_ledger")

			tc.fix(b)
			dry := b.replay(t, kafka.ReplayOptions{DryRun: true, ChunkSize: 7})
			checkReport(t, "dry run", dry, len(fixable), 0, tc.failing)
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != rawBefore {
				t.Errorf("the dry run changed raw.app_events: %d rows, had %d", n, rawBefore)
			}
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.ingest_ledger"); n != ledgerBefore {
				t.Errorf("the dry run wrote ledger rows: %d, had %d", n, ledgerBefore)
			}
			if n := ingesttest.Scalar(t, b.pool, replayedSQL); n != 0 {
				t.Errorf("the dry run marked %d dead letters replayed", n)
			}

			rep := b.replay(t, kafka.ReplayOptions{ChunkSize: 7})
			checkReport(t, "replay", rep, len(fixable), 0, tc.failing)
			want := maps.Clone(good)
			maps.Copy(want, fixable)
			assertRawIDs(t, b, want)
			ingesttest.AssertLedger(t, b.pool, "app_events")
			if n := ingesttest.Scalar(t, b.pool, ledgerOffRawSQL); n != 0 {
				t.Errorf("%d ledger rows differ from the raw rows by load transaction and hour", n)
			}
			if n := ingesttest.Scalar(t, b.pool, replayedSQL+" AND convert_from(record_key, 'UTF8') LIKE 'fixable-%'"); n != int64(len(fixable)) {
				t.Errorf("%d dead letters of fixable events marked replayed, want %d", n, len(fixable))
			}
			// Those that still fail are left as they were.
			if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters
				WHERE replayed_at IS NULL AND (record_key IS NULL OR convert_from(record_key, 'UTF8') LIKE 'broken-%')`); n != 6 {
				t.Errorf("%d dead letters not replayed, want the 6 that still fail", n)
			}
			// Replayed rows carry the record's coordinates and the
			// service clock's ingestion time.
			if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.app_events
				WHERE event_id LIKE 'fixable-%' AND kafka_topic = $1 AND kafka_offset >= 20 AND ingested_at = $2`, b.topic, testNow); n != int64(len(fixable)) {
				t.Errorf("%d replayed raw rows with their coordinates and ingestion time, want %d", n, len(fixable))
			}

			again := b.replay(t, kafka.ReplayOptions{ChunkSize: 7})
			checkReport(t, "second replay", again, 0, 0, tc.failing)
			assertRawIDs(t, b, want)
			ingesttest.AssertLedger(t, b.pool, "app_events")
		})
	}
}

// TestReplayAlreadyStored: a dead letter whose event was stored meanwhile
// (the producer sent it again after max_age was widened) is not written
// twice, and is marked replayed and counted as already stored; a dry run
// says so first.
func TestReplayAlreadyStored(t *testing.T) {
	b := setup(t, 1)
	b.maxAge = "1d"
	old := rfc3339(testNow.Add(-72 * time.Hour))
	b.ingestAll(t, []*kgo.Record{
		event(b.topic, "resent", old),
		event(b.topic, "only-dead", old),
		event(b.topic, "fresh", rfc3339(testNow)),
	})
	b.maxAge = "30d"
	b.ingestAll(t, []*kgo.Record{event(b.topic, "resent", old)})
	assertRawIDs(t, b, map[string]bool{"resent": true, "fresh": true})

	dry := b.replay(t, kafka.ReplayOptions{DryRun: true})
	checkReport(t, "dry run", dry, 1, 1, map[string]int{})
	rep := b.replay(t, kafka.ReplayOptions{})
	checkReport(t, "replay", rep, 1, 1, map[string]int{})
	assertRawIDs(t, b, map[string]bool{"resent": true, "fresh": true, "only-dead": true})
	ingesttest.AssertLedger(t, b.pool, "app_events")
	if n := ingesttest.Scalar(t, b.pool, replayedSQL); n != 2 {
		t.Errorf("%d dead letters marked replayed, want 2", n)
	}
	again := b.replay(t, kafka.ReplayOptions{})
	checkReport(t, "second replay", again, 0, 0, map[string]int{})
}

// TestReplayDedupeByID: on a source with dedupe.by: event_id, a dead
// letter whose id was loaded since (with another event time) is counted as
// already stored and not loaded, in the dry run too; one whose id was not
// loads.
func TestReplayDedupeByID(t *testing.T) {
	b := setup(t, 1)
	b.yaml = "    dedupe: {by: event_id, window: 7d}\n"
	b.maxAge = "1d"
	b.ingestAll(t, []*kgo.Record{
		event(b.topic, "resent", rfc3339(testNow.Add(-72*time.Hour))),
		event(b.topic, "only-dead", rfc3339(testNow.Add(-72*time.Hour))),
	})
	b.ingestAll(t, []*kgo.Record{event(b.topic, "resent", rfc3339(testNow))})
	assertRawIDs(t, b, map[string]bool{"resent": true})
	b.maxAge = "30d"

	dry := b.replay(t, kafka.ReplayOptions{DryRun: true})
	checkReport(t, "dry run", dry, 1, 1, map[string]int{})
	rep := b.replay(t, kafka.ReplayOptions{})
	checkReport(t, "replay", rep, 1, 1, map[string]int{})
	if ids := rawIDs(t, b); ids["resent"] != 1 || ids["only-dead"] != 1 {
		t.Errorf("raw events by id %v, want resent and only-dead once each", ids)
	}
	ingesttest.AssertLedger(t, b.pool, "app_events")
}

// TestReplaySelection: --reason and --since limit what a replay reads.
func TestReplaySelection(t *testing.T) {
	b := setup(t, 1)
	b.maxAge = "1d"
	b.ingestAll(t, []*kgo.Record{
		event(b.topic, "old", rfc3339(testNow.Add(-72*time.Hour))),
		event(b.topic, "unreadable", `"soon"`),
	})
	b.maxAge = "30d"
	for _, tc := range []struct {
		name string
		opts kafka.ReplayOptions
		read int
	}{
		{"another reason", kafka.ReplayOptions{Reason: decode.ReasonMissingID}, 0},
		{"one reason", kafka.ReplayOptions{Reason: decode.ReasonInvalidTime, DryRun: true}, 1},
		{"arrived later", kafka.ReplayOptions{Since: testNow.Add(time.Minute)}, 0},
		{"arrived since", kafka.ReplayOptions{Since: testNow.Add(-time.Minute), DryRun: true}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rep := b.replay(t, tc.opts); rep.Read != tc.read {
				t.Errorf("read %d dead letters, want %d", rep.Read, tc.read)
			}
		})
	}
	if n := ingesttest.Scalar(t, b.pool, replayedSQL); n != 0 {
		t.Errorf("%d dead letters marked replayed, want none", n)
	}
}
