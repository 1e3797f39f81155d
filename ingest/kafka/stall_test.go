package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// stallCase is one way to make the warehouse refuse the writes of the
// source "other" (topic other) while app_events (topic events) is
// healthy, and the fix.
type stallCase struct {
	name string
	// other is the YAML of the source other, and fixed its YAML after
	// the fix when the fix is a change of configuration (a restart).
	other, fixed string
	// records are what the test sends to topic other before and after
	// the fix (a Debezium stream, or JSON events).
	dbz *debeziumtest.Stream
	// role runs the ingester as a role that is not a superuser.
	role bool
	// before breaks the warehouse once raw.other exists, and fix mends
	// it.
	before, fix func(t *testing.T, s *stallEnv)
	// stalls is false when the refusal is of rows, which become dead
	// letters, not of the source; fixText is in the stall's fix.
	stalls  bool
	fixText string
}

// stallEnv is the running test of one stallCase.
type stallEnv struct {
	*bundle
	role string // the ingester's role when not the superuser
}

func (s *stallEnv) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := s.pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// otherEvents are n JSON events of the source other, ids o<first>...
func otherEvents(first, n int, amount int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		at := testNow.Add(-time.Duration(first+i) * time.Minute)
		recs[i] = &kgo.Record{Topic: "other", Value: fmt.Appendf(nil, `{"event_id":"o%d","event_time":%q,"amount":%d}`,
			first+i, at.Format(time.RFC3339), amount)}
	}
	return recs
}

const otherJSON = `  other:
    kafka: {topics: [other]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
`

// TestSourceStallsAlone: two sources in one process, the warehouse
// refusing the writes of one of them (a Debezium mirror that does not
// exist and nothing says how to create; a source column with the name of
// the mirror's own loaded_at; the INSERT privilege on the raw table
// revoked): the healthy source's events load within seconds while the
// other's partitions wait, with nothing stored, dead-lettered or moved;
// readiness, the metric and Stalls name it with the fix; after the fix it
// resumes by itself and every event is stored exactly once. A CHECK
// constraint that refuses every row of a batch is a refusal of rows:
// they become dead letters, the source goes on, and a replay after the
// fix loads them.
func TestSourceStallsAlone(t *testing.T) {
	at := testNow.Add(-time.Hour)
	newStream := func(schemas bool) *debeziumtest.Stream {
		s := debeziumtest.New(debeziumtest.PostgreSQL, schemas, "other", 1, at)
		for id := range int64(5) {
			s.Insert(id+1, debeziumtest.Values{Name: fmt.Sprintf("n%d", id), Bio: "b", Balance: 100 * id})
			s.Commit()
		}
		s.Update(2, debeziumtest.Values{Name: "n2b", Bio: "b2", Balance: 7})
		s.Delete(3)
		s.Commit()
		return s
	}
	tests := []stallCase{
		{
			name:    "mirror missing",
			other:   "  other:\n    kafka: {topics: [other]}\n    format: debezium\n    mirror: {table: dw.customers}\n",
			dbz:     newStream(false),
			fix:     func(t *testing.T, s *stallEnv) { createMirror(t, s.pool) },
			stalls:  true,
			fixText: "sources.other.mirror.table",
		},
		{
			name:    "own column name",
			other:   "  other:\n    kafka: {topics: [other]}\n    format: debezium\n    mirror: {table: dw.customers, loaded_column: name}\n",
			fixed:   "  other:\n    kafka: {topics: [other]}\n    format: debezium\n    mirror: {table: dw.customers}\n",
			dbz:     newStream(true),
			stalls:  true,
			fixText: "sources.other.mirror.loaded_column",
		},
		{
			name:    "insert revoked",
			other:   otherJSON,
			role:    true,
			before:  func(t *testing.T, s *stallEnv) { s.exec(t, "REVOKE INSERT ON raw.other FROM "+s.role) },
			fix:     func(t *testing.T, s *stallEnv) { s.exec(t, "GRANT INSERT ON raw.other TO "+s.role) },
			stalls:  true,
			fixText: "tidemark grants",
		},
		{
			name:  "check constraint",
			other: otherJSON,
			before: func(t *testing.T, s *stallEnv) {
				s.exec(t, "ALTER TABLE raw.other ADD CONSTRAINT no_refunds CHECK ((payload->>'amount')::int >= 0)")
			},
			fix: func(t *testing.T, s *stallEnv) { s.exec(t, "ALTER TABLE raw.other DROP CONSTRAINT no_refunds") },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.role && pgtest.OnCitus() {
				t.Skip("the role's grants are not propagated to the workers of the shared cluster")
			}
			testSourceStallsAlone(t, tc)
		})
	}
}

func testSourceStallsAlone(t *testing.T, tc stallCase) {
	ctx := context.Background()
	b := setupWith(t, 2, pgtest.NewDatabase(t), kafkatest.NewCluster(t, 2, "events", "other"))
	s := &stallEnv{bundle: b}
	b.yaml = tc.other
	if tc.role {
		s.role = ingestRole(t, b)
	}
	start := func() *running {
		opts := kafka.Options{}
		kafka.SetStallRetry(&opts, 100*time.Millisecond)
		return b.startWith(t, opts)
	}
	r := start()
	// The ingester creates the raw tables before it reads anything.
	if err := waitfor.Poll(30*time.Second, func() bool {
		return ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('raw.other')") == 1
	}); err != nil {
		t.Fatal("raw.other was not created")
	}
	if tc.before != nil {
		tc.before(t, s)
	}

	healthy := map[string]bool{}
	p := &produced{end: map[int32]int64{}}
	sendHealthy := func(from, n int) {
		var recs []*kgo.Record
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("h%d", i)
			healthy[id] = true
			recs = append(recs, b.event(int32(i%2), id, i%60))
		}
		b.produce(t, p, recs)
	}
	var otherRecs []*kgo.Record
	if tc.dbz != nil {
		otherRecs = tc.dbz.Records
	} else {
		otherRecs = append(otherEvents(0, 40, -1), otherEvents(40, 10, 5)...)
	}
	for _, rec := range otherRecs {
		rec.Topic, rec.Partition = "other", 0
	}
	kafkatest.Produce(t, b.producer, otherRecs...)
	sendHealthy(0, 100)
	healthyWithin := 30 * time.Second
	b.waitStored(t, p.end, healthyWithin)

	if tc.stalls {
		// The source stalls: named with its fix, nothing of it stored.
		var st kafka.Stall
		if err := waitfor.Poll(30*time.Second, func() bool {
			for _, x := range r.in.Stalls() {
				if x.Source == "other" {
					st = x
					return true
				}
			}
			return false
		}); err != nil {
			t.Fatalf("the source other was not reported stalled: %v", r.in.Stalls())
		}
		if !strings.Contains(st.Error(), tc.fixText) {
			t.Errorf("the stall %q does not name %q", st.Error(), tc.fixText)
		}
		if v := gauge(t, r.reg, "tidemark_ingest_source_stalled", "other"); v != 1 {
			t.Errorf("tidemark_ingest_source_stalled{source=other} = %v, want 1", v)
		}
		if v := gauge(t, r.reg, "tidemark_ingest_source_stalled", "app_events"); v != 0 {
			t.Errorf("tidemark_ingest_source_stalled{source=app_events} = %v, want 0", v)
		}
		// More healthy events load while the other source waits.
		sendHealthy(100, 100)
		b.waitStored(t, p.end, healthyWithin)
		if n := ingesttest.Scalar(t, b.pool, "SELECT coalesce(max(next_offset), -1) FROM tidemark.kafka_offsets WHERE topic = 'other'"); n > 0 {
			t.Errorf("the stalled source's offsets moved to %d", n)
		}
		if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters WHERE source = 'other'"); n != 0 {
			t.Errorf("%d dead letters of the stalled source, want none", n)
		}
		if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.other"); n != 0 {
			t.Errorf("raw.other holds %d rows while stalled", n)
		}
	} else {
		// Rows refused one by one: dead letters, and the source goes on.
		ingesttest.WaitStored(t, b.pool, group, "other", map[int32]int64{0: int64(len(otherRecs))}, 30*time.Second)
		if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters WHERE source = 'other' AND reason = 'rejected'"); n != 40 {
			t.Errorf("%d rejected dead letters of other, want 40", n)
		}
		if got := r.in.Stalls(); len(got) != 0 {
			t.Errorf("stalled sources %v, want none: a row refused is the row's", got)
		}
	}

	if tc.fix != nil {
		tc.fix(t, s)
	}
	if tc.fixed != "" {
		r.stop(t)
		b.yaml = tc.fixed
		r = start()
	}
	ingesttest.WaitStored(t, b.pool, group, "other", map[int32]int64{0: int64(len(otherRecs))}, time.Minute)
	if err := waitfor.Poll(30*time.Second, func() bool { return len(r.in.Stalls()) == 0 }); err != nil {
		t.Errorf("still stalled after the fix: %v", r.in.Stalls())
	}
	if v := gauge(t, r.reg, "tidemark_ingest_source_stalled", "other"); v != 0 {
		t.Errorf("tidemark_ingest_source_stalled{source=other} = %v after the fix, want 0", v)
	}
	if !tc.stalls {
		conn := pgtest.Conn(t, b.dsn)
		rep, err := kafka.Replay(ctx, conn, kafka.ConfigFrom(b.config(t)), kafka.ReplayOptions{Source: "other", Now: b.clock.Now})
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if rep.Loaded != 40 {
			t.Errorf("replay loaded %d, want 40", rep.Loaded)
		}
	}
	r.stop(t)

	// Every event exactly once.
	ingesttest.AssertRaw(t, b.pool, "app_events", healthy)
	if tc.dbz != nil {
		debeziumtest.AssertMirror(t, b.pool, "dw.customers", tc.dbz)
		debeziumtest.AssertChanges(t, b.pool, "other", tc.dbz)
	} else {
		want := map[string]bool{}
		for i := range 50 {
			want[fmt.Sprintf("o%d", i)] = true
		}
		ingesttest.AssertRaw(t, b.pool, "other", want)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters WHERE replayed_at IS NULL"); n != 0 {
		t.Errorf("%d dead letters not replayed, want none", n)
	}
	ingesttest.AssertLedger(t, b.pool, "app_events")
}

// ingestRole creates a role that is not a superuser with what the
// ingester needs, and points the bundle's warehouse DSN at it.
func ingestRole(t *testing.T, b *bundle) string {
	t.Helper()
	var db string
	if err := b.pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := "ingest_" + db
	s := &stallEnv{bundle: b}
	s.exec(t, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN;
GRANT USAGE, CREATE ON SCHEMA raw TO %[1]s;
GRANT USAGE ON SCHEMA tidemark TO %[1]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tidemark TO %[1]s;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA tidemark TO %[1]s`, role))
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %[1]s CASCADE; DROP ROLE %[1]s", role))
	})
	if !strings.HasPrefix(b.dsn, "postgres://postgres@") {
		t.Fatalf("the test DSN %q does not name the postgres user", b.dsn)
	}
	b.dsn = strings.Replace(b.dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	return role
}

// gauge reads one series of a gauge.
func gauge(t *testing.T, reg *prometheus.Registry, name, source string) float64 {
	t.Helper()
	v, err := promreg.SumWhere(reg, name, "source", source)
	if err != nil {
		t.Fatalf("%s{source=%s}: %v", name, source, err)
	}
	return v
}
