package bench

import (
	"fmt"
	"os"
	"testing"
)

// dedupeKeys are the source keys that turn on dedupe by event id.
const dedupeKeys = "    dedupe: {by: event_id, window: 7d}"

// BenchmarkIngestDedupe measures tidemark's Kafka ingest with dedupe.by:
// event_id against the default, on the same events (BenchmarkIngest's, on
// 4 partitions, none a duplicate) in TIDEMARK_BENCH_ROUNDS rounds that
// alternate which goes first, each on a fresh database, and reports the
// median of the rounds' ratios as dedupe/default.
func BenchmarkIngestDedupe(b *testing.B) {
	n := size("TIDEMARK_BENCH_EVENTS", 1_000_000, 100_000)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	e := &env{srv: durableServer(b)}
	for range b.N {
		recs, avg := workloadOn(n, parts)
		e.kc = newCluster(b, parts)
		end := e.produce(b, recs)
		fmt.Fprintf(os.Stderr, "\ningest with dedupe.by: event_id, %d events of ~%.0f bytes on %d partitions, batches of %d\n",
			n, avg, parts, batchRows(b))
		measure := func(keys string) float64 {
			e.sourceKeys = keys
			rate, _ := e.measureGroup(b, end, n, 1, "bench-dedupe")
			fmt.Fprintf(os.Stderr, "    %s: %s\n", map[bool]string{true: "dedupe", false: "default"}[keys != ""], e.cpu)
			return rate
		}
		var ratios, plain, deduped []float64
		for r := range rounds {
			var p, d float64
			if r%2 == 0 {
				p, d = measure(""), measure(dedupeKeys)
			} else {
				d, p = measure(dedupeKeys), measure("")
			}
			ratios, plain, deduped = append(ratios, d/p), append(plain, p), append(deduped, d)
			fmt.Fprintf(os.Stderr, "  round %d: default %9.0f rows/s, dedupe %9.0f rows/s, dedupe/default = %.2f\n", r+1, p, d, d/p)
		}
		e.sourceKeys = ""
		e.kc.Close()
		b.ReportMetric(medianOf(plain), "default_rows/s")
		b.ReportMetric(medianOf(deduped), "dedupe_rows/s")
		b.ReportMetric(medianOf(ratios), "dedupe/default")
	}
}
