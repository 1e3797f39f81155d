package kafka_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestRegistryAnswersNotASchema loads Avro records while the registry (a
// proxy in front of it) answers 200 with a body that is not a schema for
// the schema id of new records: the records of a cached schema load, the
// partitions wait at the first record of the new id, readiness says why,
// nothing is dead-lettered, and once the registry answers the schema
// every record loads once.
func TestRegistryAnswersNotASchema(t *testing.T) {
	pgtest.ServerIndependent(t)
	for _, body := range []string{`{}`, `{"schema":""}`, `{"message":"ok"}`} {
		t.Run(body, func(t *testing.T) {
			g := srtest.New(t)
			b := avroBundle(t, 2, g)
			opts := kafka.Options{}
			kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
			r := b.startWith(t, opts)
			ts := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
			p := &produced{end: map[int32]int64{}}
			total := 0
			batch := func(phase string, enc func(any) []byte, n int) {
				var recs []*kgo.Record
				for i := range 2 * n {
					recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 2),
						Value: enc(map[string]any{"event_id": fmt.Sprintf("%s-%d", phase, i), "event_time": ts, "v": int32(i)})})
				}
				b.produce(t, p, recs)
				total += len(recs)
			}
			cachedSchema, newSchema := eventSchema("Cached", `"int"`), eventSchema("New", `"int"`)
			cached := srtest.AvroEncoder(t, g.Register("events-value", sr.Schema{Schema: cachedSchema}), cachedSchema)
			newID := g.Register("events-value", sr.Schema{Schema: newSchema})
			batch("cached", cached, 50)
			b.waitStored(t, p.end, time.Minute)

			g.Answer(newID, http.StatusOK, body)
			stuck := map[int32]int64{}
			for part, end := range p.end {
				stuck[part] = end
			}
			batch("new", srtest.AvroEncoder(t, newID, newSchema), 50)
			failedBefore := counterSum(t, r, "tidemark_schema_registry_errors_total")
			// Dead letters end the wait too: the records of the new id
			// were taken as invalid.
			waitfor.Until(t, "attempts at the registry fail", func() bool {
				return counterSum(t, r, "tidemark_schema_registry_errors_total") >= failedBefore+3 ||
					ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters") > 0
			})
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
				t.Fatalf("%d dead letters while the registry answers %s", n, body)
			}
			if err := r.in.RegistryError(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("/schemas/ids/%d is not a schema", newID)) {
				t.Errorf("RegistryError() = %v while the registry answers %s", err, body)
			}
			stored := ingesttest.StoredOffsets(t, b.pool, group, b.topic)
			for part, off := range stuck {
				if stored[part] != off {
					t.Errorf("partition %d stored at %d while the registry answers %s, want %d (the first record of the new id)", part, stored[part], body, off)
				}
			}

			g.Heal()
			b.waitStored(t, p.end, time.Minute)
			if err := r.in.RegistryError(); err != nil {
				t.Errorf("RegistryError() = %v after the registry recovered", err)
			}
			r.stop(t)
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(DISTINCT event_id) FROM raw.app_events"); n != int64(total) {
				t.Errorf("%d distinct events stored, want %d", n, total)
			}
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(total) {
				t.Errorf("%d rows, want %d", n, total)
			}
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
				t.Errorf("%d dead letters", n)
			}
		})
	}
}

// TestRegistryRefusesCredentials checks that a registry answering 401 to
// the configured credentials is reported as refusing them, naming the
// settings, in the log and in RegistryError (which /readyz and the status
// page show), and that the records wait, without dead letters, until it
// accepts them.
func TestRegistryRefusesCredentials(t *testing.T) {
	pgtest.ServerIndependent(t)
	var password atomic.Value
	password.Store("rotated")
	g := srtest.NewWith(t, srtest.Options{Auth: func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == "reader" && p == password.Load().(string)
	}})
	b := setup(t, 1)
	b.yaml = "    format: avro\n"
	b.kafkaYAML = fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms, basic: {username: reader, password: old}}\n", g.URL())
	schema := eventSchema("E", `"int"`)
	enc := srtest.AvroEncoder(t, g.Register("events-value", sr.Schema{Schema: schema}), schema)
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: enc(map[string]any{"event_id": fmt.Sprintf("e-%d", i),
			"event_time": time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC), "v": int32(i)})})
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	logs := &syncbuf.Buffer{}
	opts := kafka.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
	r := b.startWith(t, opts)
	waitfor.Until(t, "attempts at the registry fail", func() bool {
		return counterSum(t, r, "tidemark_schema_registry_errors_total") >= 3
	})
	const says = `the registry refused the credentials (HTTP 401 from `
	const check = `check schema_registry.basic (username \"reader\")`
	err := r.in.RegistryError()
	if err == nil || !strings.HasPrefix(err.Error(), "schema registry refusing the credentials since ") ||
		!strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), strings.ReplaceAll(check, `\"`, `"`)) {
		t.Errorf("RegistryError() = %v", err)
	}
	if log := logs.String(); !strings.Contains(log, says) || !strings.Contains(log, check) {
		t.Errorf("the log does not say that the registry refused the credentials:\n%s", log)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Fatalf("%d dead letters while the registry refuses the credentials", n)
	}
	password.Store("old")
	b.waitStored(t, p.end, time.Minute)
	if err := r.in.RegistryError(); err != nil {
		t.Errorf("RegistryError() = %v once the registry accepts the credentials", err)
	}
	r.stop(t)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(len(recs)) {
		t.Errorf("%d rows, want %d", n, len(recs))
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}
