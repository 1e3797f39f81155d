package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestTopicRecreated: a partition whose stored position (6) is beyond the
// end of the broker's log (3, the topic deleted and created again) starts
// at kafka.start_offset: with earliest every record of the new log loads,
// although below the stored position; with latest those produced from
// then on. The reset is logged at warn with both offsets, counted and
// listed for the status page.
func TestTopicRecreated(t *testing.T) {
	pgtest.CitusIndependent(t)
	for _, tt := range []struct {
		start string
		want  string // the ids of the new log loaded
	}{
		{"earliest", "b0,b1,b2,b3,b4"},
		{"latest", "b3,b4"},
	} {
		t.Run(tt.start, func(t *testing.T) {
			ctx := context.Background()
			b := setup(t, 1)
			p := &produced{end: map[int32]int64{}}
			send := func(ids ...string) {
				var recs []*kgo.Record
				for _, id := range ids {
					recs = append(recs, b.event(0, id, 1))
				}
				b.produce(t, p, recs)
			}
			send("a0", "a1", "a2", "a3", "a4", "a5")
			r := b.start(t)
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)

			adm := kadm.NewClient(b.producer)
			if _, err := adm.DeleteTopics(ctx, b.topic); err != nil {
				t.Fatal(err)
			}
			if _, err := adm.CreateTopic(ctx, 1, 1, nil, b.topic); err != nil {
				t.Fatal(err)
			}
			// A client of the old topic's id cannot produce to the new.
			b.producer = kafkatest.Producer(t, b.kafka, kgo.RecordPartitioner(kgo.ManualPartitioner()))
			p = &produced{end: map[int32]int64{}}
			send("b0", "b1", "b2")
			b.kafkaYAML = "  start_offset: " + tt.start

			logs := kafkatest.NewLogRecorder(slog.LevelWarn)
			r = b.startWith(t, kafka.Options{Logger: slog.New(logs)})
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			line, err := logs.Wait(wctx, func(l kafkatest.LogLine) bool {
				return strings.Contains(l.Msg, "stored position is beyond the broker's log")
			})
			if err != nil {
				t.Fatalf("no warning of the reset: %v", err)
			}
			if line.Attrs["stored_offset"] != "6" || line.Attrs["log_end"] != "3" {
				t.Errorf("the warning says stored_offset %s, log_end %s; want 6 and 3", line.Attrs["stored_offset"], line.Attrs["log_end"])
			}
			// Records produced from now on load under either setting; with
			// latest, one produced before the client found the log's end
			// is not loaded, so send until one is.
			loaded := func(id string) bool {
				return ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id = $1", id) == 1
			}
			if err := waitfor.Poll(time.Minute, func() bool {
				if loaded("b3") {
					return true
				}
				send("b3")
				return waitfor.Poll(2*time.Second, func() bool { return loaded("b3") }) == nil
			}); err != nil {
				t.Fatalf("records produced after the restart did not load")
			}
			send("b4")
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			got := strings.Join(pgtest.Rows(t, b.pool, "SELECT event_id FROM raw.app_events WHERE event_id LIKE 'b%' ORDER BY 1"), ",")
			if got != tt.want {
				t.Errorf("loaded %s of the new log, want %s", got, tt.want)
			}
			if n := counterSum(t, r, "tidemark_ingest_offset_resets_total"); n != 1 {
				t.Errorf("tidemark_ingest_offset_resets_total = %v, want 1", n)
			}
			resets := r.in.Resets()
			if len(resets) != 1 || resets[0].Stored != 6 || resets[0].LogEnd != 3 || resets[0].Source != "app_events" {
				t.Errorf("Resets() = %+v, want one of app_events from 6 with the log ending at 3", resets)
			} else {
				t.Log(resets[0])
			}
			if got, want := fmt.Sprint(ingesttest.StoredOffsets(t, b.pool, group, b.topic)), fmt.Sprint(p.end); got != want {
				t.Errorf("stored offsets %s, want %s", got, want)
			}
		})
	}
}
