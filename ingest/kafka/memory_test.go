package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// memorySlack is what the process holds beyond ingest.memory_max_bytes
// in these tests: the encoding of the rows being copied, the connections'
// buffers, and the test's own broker, in the same process, building fetch
// responses (its compression pools alone hold 8 MiB).
const memorySlack = 24 << 20

// TestMemoryBudget loads streams many times ingest.memory_max_bytes in
// records of every size, and checks that the live heap never grew beyond
// the budget plus memorySlack over what it was before the ingester
// started. The collector runs at every 5% of growth, so that the live
// heap is sampled often.
func TestMemoryBudget(t *testing.T) {
	pgtest.ServerIndependent(t) // nothing of it depends on the server's version
	for _, tc := range []struct {
		name         string
		parts        int32
		records      int
		size         int // bytes of each record's value, about
		budget       int // ingest.memory_max_bytes
		compressible bool
	}{
		{name: "records of 1 MiB", parts: 1, records: 96, size: 1 << 20, budget: 8 << 20},
		{name: "64 partitions", parts: 64, records: 40_000, size: 1500, budget: 8 << 20},
		{name: "records that compress 100 times", parts: 4, records: 40_000, size: 2000, budget: 8 << 20, compressible: true},
		{name: "a record larger than the budget", parts: 1, records: 3, size: 12 << 20, budget: 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := kafkatest.NewClusterWith(t, tc.parts, []string{"events"}, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "33554432"}))
			// A record batch is fetched whole: the producer's batches are
			// as large as one record and 1 MiB (a broker's default
			// message.max.bytes), as large as the largest record here.
			b := setupWith(t, tc.parts, pgtest.NewDatabase(t), c, kgo.ProducerBatchMaxBytes(int32(max(tc.size+4096, 1<<20))))
			b.ingestYAML = fmt.Sprintf("  memory_max_bytes: %d", tc.budget)
			p := &produced{end: map[int32]int64{}}
			want := map[string]bool{}
			for start := 0; start < tc.records; start += 1000 {
				var recs []*kgo.Record
				for i := start; i < min(start+1000, tc.records); i++ {
					id := fmt.Sprintf("m-%d", i)
					want[id] = true
					recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i) % tc.parts,
						Value: memoryEvent(id, tc.size, tc.compressible)})
				}
				b.produce(t, p, recs)
			}
			peak := sampleLiveHeap(t, func() {
				r := b.start(t)
				b.waitStored(t, p.end, 5*time.Minute)
				r.stop(t)
			})
			t.Logf("%d records of %d bytes on %d partitions (%d MiB), budget %d MiB: live heap grew by %.1f MiB at most",
				tc.records, tc.size, tc.parts, tc.records*tc.size>>20, tc.budget>>20, float64(peak)/(1<<20))
			limit := int64(tc.budget + memorySlack)
			if tc.size > tc.budget {
				// Each is a batch of its own: one written, one decoded
				// ahead, one fetched, and the broker's response.
				limit = int64(4*tc.size + memorySlack)
			}
			if peak > limit {
				t.Errorf("live heap grew by %d MiB, more than %d MiB", peak>>20, limit>>20)
			}
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(DISTINCT event_id) FROM raw.app_events"); n != int64(len(want)) {
				t.Errorf("%d events stored, want %d", n, len(want))
			}
		})
	}
}

// memoryEvent is an event of about size bytes: random text, or text that
// compresses about a hundred times.
func memoryEvent(id string, size int, compressible bool) []byte {
	var pad string
	if compressible {
		pad = strings.Repeat("tidemark", size/8)
	} else {
		const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = letters[rand.IntN(len(letters))]
		}
		pad = string(buf)
	}
	return fmt.Appendf(nil, `{"event_id":%q,"event_time":%q,"pad":%q}`, id, testNow.Add(-time.Hour).Format(time.RFC3339), pad)
}

// sampleLiveHeap runs load and returns how much the live heap (as the
// collector last marked it) grew beyond what it was before, at most.
func sampleLiveHeap(t *testing.T, load func()) int64 {
	t.Helper()
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	// Twice: what sync.Pools hold survives one collection, and its
	// release would hide as much growth.
	runtime.GC()
	runtime.GC()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	live := func() int64 {
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	base := live()
	var peak atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond) // a sampling rate, not a wait
		defer tick.Stop()
		for {
			if l := live() - base; l > peak.Load() {
				peak.Store(l)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	load()
	cancel()
	<-done
	return peak.Load()
}

// TestMemoryBudgetDebezium: a Debezium source's changes, applied to its
// mirror batch by batch, keep the live heap within the budget too. The
// changes are of rows of 100 KB in transactions of 50 rows: the stream
// is eight times the budget.
func TestMemoryBudgetDebezium(t *testing.T) {
	pgtest.ServerIndependent(t)
	const budget = 8 << 20
	b := setup(t, 2)
	s := debeziumtest.New(debeziumtest.PostgreSQL, true, b.topic, 2, testNow.Add(-48*time.Hour))
	bio := strings.Repeat("0123456789", 10_000)
	for id := range int64(640) {
		s.Insert(id, debeziumtest.Values{Name: fmt.Sprint("n", id), Bio: bio[id%10:], Balance: id})
		if id%3 == 0 {
			s.Update(id, debeziumtest.Values{Name: fmt.Sprint("m", id), Bio: bio[id%7:], Balance: id + 1})
		}
		if id%50 == 49 {
			s.Commit()
		}
	}
	s.Commit()
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, s.Records)
	yaml := strings.Replace(b.debeziumYAML(5000), "batch_max_age: 50ms}", fmt.Sprintf("batch_max_age: 50ms, memory_max_bytes: %d}", budget), 1)
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	peak := sampleLiveHeap(t, func() {
		in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Now: b.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		r := b.run(t, in)
		b.waitStored(t, p.end, 5*time.Minute)
		r.stop(t)
	})
	t.Logf("%d changes of rows of 100 KB, budget %d MiB: live heap grew by %.1f MiB at most", s.Changes, budget>>20, float64(peak)/(1<<20))
	if peak > budget+memorySlack {
		t.Errorf("live heap grew by %d MiB, more than %d MiB", peak>>20, (budget+memorySlack)>>20)
	}
	debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
	debeziumtest.AssertChanges(t, b.pool, "customers", s)
}
