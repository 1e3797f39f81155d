// Package ingesttest generates Kafka workloads with known outcomes and
// checks what the warehouse holds against them. It is used by the tests of
// the ingester and of the tidemark command.
package ingesttest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The reasons of the workload's bad records, as tidemark.dead_letters
// stores them: the test compares what the ingester wrote with these
// values, not with the ingester's own constants.
const (
	reasonInvalidJSON    = "invalid_json"
	reasonMissingID      = "missing_id"
	reasonInvalidTime    = "invalid_time"
	reasonTimeOutOfRange = "time_out_of_range"
)

// BadRecord is what a test expects to find in dead_letters for one record,
// identified by its unique key.
type BadRecord struct {
	Reason string
	Value  []byte
}

// Workload is a generated stream and its expected outcome.
type Workload struct {
	Records []*kgo.Record
	Good    map[string]bool      // distinct good event ids
	Bad     map[string]BadRecord // by record key
	Dups    int                  // records repeating an earlier good event
}

// Make generates n records for topic over parts partitions: a share badFrac
// of bad records cycling through four reasons, a share dupFrac of
// re-sends of earlier good events (same id and time, new key, any
// partition), and good events of about 200 bytes with event times in the
// ten days before now.
func Make(topic string, n int, parts int32, seed uint64, badFrac, dupFrac float64, now time.Time) *Workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &Workload{Good: map[string]bool{}, Bad: map[string]BadRecord{}}
	var goodVals [][]byte
	reasons := []string{reasonInvalidJSON, reasonMissingID, reasonInvalidTime, reasonTimeOutOfRange}
	pad := strings.Repeat("x", 60)
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k-%d-%d", seed, i)
		r := &kgo.Record{Topic: topic, Key: []byte(key), Partition: int32(i) % parts,
			Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t-" + key)}}}
		id := fmt.Sprintf("e-%d-%d", seed, i)
		ts := now.Add(-time.Duration(rng.Int64N(int64(240 * time.Hour)))).Truncate(time.Millisecond)
		good := fmt.Sprintf(`{"event_id":%q,"event_time":%q,"user":"u-%d","amount":%d.%02d,"pad":%q}`,
			id, ts.Format(time.RFC3339Nano), rng.IntN(5000), rng.IntN(500), rng.IntN(100), pad)
		switch x := rng.Float64(); {
		case x < badFrac:
			reason := reasons[len(w.Bad)%len(reasons)]
			switch reason {
			case reasonInvalidJSON:
				r.Value = []byte(good[:len(good)/2])
			case reasonMissingID:
				r.Value = []byte(strings.Replace(good, `"event_id"`, `"id"`, 1))
			case reasonInvalidTime:
				r.Value = []byte(strings.Replace(good, ts.Format(time.RFC3339Nano), "yesterday at noon", 1))
			case reasonTimeOutOfRange:
				r.Value = []byte(strings.Replace(good, ts.Format(time.RFC3339Nano), "2020-01-01T00:00:00Z", 1))
			}
			w.Bad[key] = BadRecord{Reason: reason, Value: r.Value}
		case x < badFrac+dupFrac && len(goodVals) > 0:
			r.Value = goodVals[rng.IntN(len(goodVals))]
			r.Partition = rng.Int32N(parts)
			w.Dups++
		default:
			r.Value = []byte(good)
			goodVals = append(goodVals, r.Value)
			w.Good[id] = true
		}
		w.Records = append(w.Records, r)
	}
	return w
}
