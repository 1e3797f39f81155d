package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
)

// BenchmarkIngestScaling measures tidemark's Kafka ingest against the
// number of partitions of the topic (1, 4, 16) and of ingesters in one
// consumer group (1, 2), each point next to a COPY of the same rows into
// an empty raw table measured just before it. It writes
// ingest_scaling.json and ingest_scaling.svg (see resultsDir).
func BenchmarkIngestScaling(b *testing.B) {
	n := size("TIDEMARK_BENCH_SCALING_EVENTS", 500_000, 50_000)
	e := &env{srv: durableServer(b)}
	for range b.N {
		started := time.Now()
		tab := &benchplot.Table{Name: "ingest_scaling", Title: "Kafka ingest vs partitions and instances",
			Meta:    runMeta(b, e.srv),
			Columns: []string{"partitions", "instances", "events", "copy_rows_per_s", "tidemark_rows_per_s", "tidemark_per_copy", "join_ms", "other_cores"}}
		tab.Meta["workload"] = fmt.Sprintf("%d JSON events of about 200 bytes per point, batches of %d", n, batchRows(b))
		for _, p := range []int32{1, 4, 16} {
			recs, _ := workloadOn(n, p)
			e.kc = newCluster(b, p)
			end := e.produce(b, recs)
			for _, instances := range []int{1, 2} {
				m := meterCPU()
				copyRate := e.measureCopy(b, recs)
				rate, join := e.measureGroup(b, end, n, instances, fmt.Sprintf("bench-p%d-i%d", p, instances))
				addRow(b, tab, float64(p), float64(instances), float64(n), copyRate, rate, rate/copyRate,
					float64(join.Milliseconds()), m.otherCores())
				fmt.Fprintf(os.Stderr, "ingest %2d partitions, %d instance(s): COPY %8.0f rows/s, tidemark %8.0f rows/s, ratio %.2f\n",
					p, instances, copyRate, rate, rate/copyRate)
			}
			e.kc.Close()
		}
		tab.Meta["took"] = time.Since(started).Round(time.Second).String()
		one := map[string]float64{"instances": 1}
		two := map[string]float64{"instances": 2}
		target := 0.85
		saveCurve(b, tab, benchplot.Figure{
			Title: fmt.Sprintf("Kafka ingest, %d events per point, fsync on", n),
			Panels: []benchplot.Panel{{
				Title: "throughput", XLabel: "topic partitions", YLabel: "rows/s", LogX: true,
				Series: []benchplot.Series{
					series(b, tab, "tidemark, 1 instance", "partitions", "tidemark_rows_per_s", one),
					series(b, tab, "tidemark, 2 instances", "partitions", "tidemark_rows_per_s", two),
					series(b, tab, "COPY (before 1 instance)", "partitions", "copy_rows_per_s", one),
					series(b, tab, "COPY (before 2 instances)", "partitions", "copy_rows_per_s", two),
				},
			}, {
				Title: "ratio to COPY of the same rows", XLabel: "topic partitions", YLabel: "tidemark / COPY (ratio)", LogX: true,
				Series: []benchplot.Series{
					series(b, tab, "1 instance", "partitions", "tidemark_per_copy", one),
					series(b, tab, "2 instances", "partitions", "tidemark_per_copy", two),
				},
				Reference: &target, ReferenceLabel: "target 0.85",
			}},
		})
	}
}
