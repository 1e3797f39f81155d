package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

const (
	topic  = "events"
	source = "app_events"
	parts  = 4
)

var benchNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one benchmark's durable PostgreSQL server, or Citus cluster, and
// kfake cluster.
type env struct {
	srv     *pgserver.Server // the server, or the cluster's coordinator
	cluster *pgtest.Cluster  // nil on one server
	shards  int              // the cluster's shards per distributed table
	kc      *kfake.Cluster
	last    string // the previous measurement's database
	cpu     cpuUse // what the last measureCopyIn or measureGroup used
	// sourceKeys are extra keys of the source measureGroup loads.
	sourceKeys string
}

// servers are the server, or the cluster's nodes, coordinator first.
func (e *env) servers() []*pgserver.Server {
	if e.cluster != nil {
		return e.cluster.Nodes()
	}
	return []*pgserver.Server{e.srv}
}

// settle drops the previous measurement's database (on every node of a
// cluster) and checkpoints.
func (e *env) settle(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	for _, srv := range e.servers() {
		admin, err := pgx.Connect(ctx, srv.URL("postgres"))
		if err != nil {
			b.Fatal(err)
		}
		if e.last != "" {
			cfg, err := pgx.ParseConfig(e.last)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
			b.Fatal(err)
		}
		admin.Close(ctx)
	}
}

// newDatabase creates an empty database: on the server, or on every node
// of the cluster with its workers registered.
func (e *env) newDatabase(b *testing.B) string {
	b.Helper()
	if e.cluster == nil {
		return pgtest.NewDatabaseOn(b, e.srv)
	}
	dsn := e.cluster.NewDatabase(b, pgtest.ClusterOptions{})
	if e.shards > 0 {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(context.Background())
		// As docs/citus.md says to: before tidemark creates its tables.
		if _, err := conn.Exec(context.Background(), fmt.Sprintf("ALTER DATABASE %s SET citus.shard_count = %d",
			pgx.Identifier{conn.Config().Database}.Sanitize(), e.shards)); err != nil {
			b.Fatal(err)
		}
	}
	return dsn
}

// newCluster starts a kfake cluster holding the topic with n partitions.
func newCluster(b *testing.B, n int32) *kfake.Cluster {
	b.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(n, topic), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(kc.Close)
	return kc
}

// durableServer starts the benchmarks' PostgreSQL server: fsync and
// synchronous_commit on, so that the numbers are those of a server that
// keeps its promises, with room for a million-row load between
// checkpoints.
func durableServer(b *testing.B) *pgserver.Server {
	b.Helper()
	return pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: profileSettings(map[string]string{
		"shared_buffers": "512MB", "max_wal_size": "4GB", "checkpoint_timeout": "15min"})})
}

// database creates a migrated warehouse database with raw.app_events. It
// first drops the previous measurement's database and checkpoints, so that
// no measurement pays for writing out the dirty pages of the one before.
func (e *env) database(b *testing.B) (string, *pgx.Conn) {
	b.Helper()
	ctx := context.Background()
	e.settle(b)
	dsn := e.newDatabase(b)
	e.last = dsn
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	if err := raw.NewTable(source, config.PartitionDay).Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	return dsn, conn
}

// produce writes the records to the topic and returns the end offsets.
func (e *env) produce(b *testing.B, recs []*kgo.Record) map[int32]int64 {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kc.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	end := map[int32]int64{}
	for i := 0; i < len(recs); i += 50_000 {
		res := cl.ProduceSync(ctx, recs[i:min(i+50_000, len(recs))]...)
		if err := res.FirstErr(); err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			end[r.Record.Partition] = max(end[r.Record.Partition], r.Record.Offset+1)
		}
	}
	return end
}

// configFor is the benchmarks' configuration; sourceKeys are added to
// the source's keys, each line indented by four spaces.
func configFor(dsn, broker, group, sourceKeys string) string {
	return fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: warn}
kafka: {brokers: [%q], group: %s}
%s
sources:
  %s:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
%s
%s
`, dsn, broker, group, batchRowsYAML(), source, topic, sourceKeys, os.Getenv("TIDEMARK_BENCH_EXTRA"))
}

// batchRowsYAML sets ingest.batch_max_rows when TIDEMARK_BENCH_BATCH_ROWS
// does, and ingest.batch_max_bytes to hold as many events of about 200
// bytes (the memory budget follows); otherwise the benchmarks run with the
// defaults.
func batchRowsYAML() string {
	if n := envInt("TIDEMARK_BENCH_BATCH_ROWS", 0); n > 0 {
		return fmt.Sprintf("ingest: {batch_max_rows: %d, batch_max_bytes: %d}", n, n*(200+kafka.RecordOverhead))
	}
	return ""
}

// batchRows is the rows of one of tidemark's transactions in these
// benchmarks, for events of about 200 bytes: ingest.batch_max_rows, or
// fewer when ingest.batch_max_bytes holds fewer, each counted as the
// ingester counts it.
func batchRows(b *testing.B) int {
	b.Helper()
	cfg, err := config.Parse("bench.yaml", []byte(configFor("postgres://localhost/x", "localhost:9092", "g", "")),
		func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	return min(int(cfg.Ingest.BatchMaxRows), int(cfg.Ingest.BatchMaxBytes)/(200+kafka.RecordOverhead))
}

// workload returns n good events of about 200 bytes.
func workload(n int) ([]*kgo.Record, float64) { return workloadOn(n, parts) }

// workloadOn returns n good events of about 200 bytes spread over
// partitions.
func workloadOn(n int, partitions int32) ([]*kgo.Record, float64) {
	w := ingesttest.Make(topic, n, partitions, 42, 0, 0, benchNow)
	short, long := `"pad":"`+strings.Repeat("x", 60), `"pad":"`+strings.Repeat("x", 95)
	var bytes int
	for _, r := range w.Records {
		r.Value = []byte(strings.Replace(string(r.Value), short, long, 1))
		bytes += len(r.Value)
	}
	return w.Records, float64(bytes) / float64(n)
}

// BenchmarkIngest compares, in one run and on the same rows: (a) COPY
// straight into the raw table, the physical limit; (b) tidemark end to end
// from Kafka; (a2) COPY in one transaction per batch; (c) a consumer that
// INSERTs record by record, the common hand-written approach (on a subset:
// it is slow). (a) and (b) are measured for a topic of 1 and of 4
// partitions, in TIDEMARK_BENCH_ROUNDS rounds (3) that alternate which
// goes first; each round gives a ratio and the run reports their median,
// as one measurement on this kind of machine moves by ±15%.
func BenchmarkIngest(b *testing.B) {
	n := size("TIDEMARK_BENCH_EVENTS", 1_000_000, 100_000)
	perRecordN := size("TIDEMARK_BENCH_PER_RECORD_EVENTS", 20_000, 2_000)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	batch := batchRows(b)
	e := &env{srv: durableServer(b)}
	for range b.N {
		var summary strings.Builder
		for _, p := range []int32{1, parts} {
			recs, avg := workloadOn(n, p)
			e.kc = newCluster(b, p)
			end := e.produce(b, recs)
			fmt.Fprintf(os.Stderr, "\ningest throughput, %d events of ~%.0f bytes on %d partition(s), batches of %d (GOMAXPROCS=%d)\n",
				n, avg, p, batch, runtime.GOMAXPROCS(0))
			if p == 1 {
				// The server's first gigabyte of WAL creates and zero-fills
				// segment files; later ones are recycled. Whichever
				// measurement came first paid for that (6% of its time
				// waiting on WALInit in a profile), so one untimed COPY
				// goes before the rounds.
				e.measureCopy(b, recs)
			}
			var ratios, copyRates, tmRates []float64
			for r := range rounds {
				var copyRate, tmRate float64
				var join time.Duration
				var copyCPU, tmCPU cpuUse
				measureA := func() {
					copyRate = e.measureCopy(b, recs)
					copyCPU = e.cpu
				}
				measureB := func() {
					tmRate, join = e.measureTidemark(b, end, n)
					tmCPU = e.cpu
				}
				if r%2 == 0 {
					measureA()
					measureB()
				} else {
					measureB()
					measureA()
				}
				ratios, copyRates, tmRates = append(ratios, tmRate/copyRate), append(copyRates, copyRate), append(tmRates, tmRate)
				fmt.Fprintf(os.Stderr, "  round %d: (a) COPY into raw.%s %9.0f rows/s, (b) tidemark from Kafka %9.0f rows/s, (b)/(a) = %.2f (group join and first batch %s)\n",
					r+1, source, copyRate, tmRate, tmRate/copyRate, join.Round(time.Millisecond))
				fmt.Fprintf(os.Stderr, "           (a) %s\n           (b) %s\n", copyCPU, tmCPU)
			}
			ratio := medianOf(ratios)
			b.ReportMetric(ratio, fmt.Sprintf("tidemark/copy_p%d", p))
			fmt.Fprintf(&summary, "  %d partition(s): median (b)/(a) = %.2f over %d rounds (target >= 0.85)\n", p, ratio, rounds)
			if p != parts {
				e.kc.Close()
				continue
			}
			batchedRate := e.measureCopyIn(b, recs, batch)
			perRate := e.measurePerRecord(b, perRecordN)
			copyRate, tmRate := medianOf(copyRates), medianOf(tmRates)
			b.ReportMetric(copyRate, "copy_rows/s")
			b.ReportMetric(batchedRate, "copy_batched_rows/s")
			b.ReportMetric(tmRate, "tidemark_rows/s")
			b.ReportMetric(perRate, "insert_rows/s")
			b.ReportMetric(tmRate/batchedRate, "tidemark/copy_batched")
			b.ReportMetric(tmRate/perRate, "tidemark/insert")
			fmt.Fprintf(os.Stderr, `  (a2) COPY in transactions of %d        %9.0f rows/s   (a2)/(a) = %.2f against the median (a)
  (c)  per-record INSERT consumer (%d events) %9.0f rows/s
  (b)/(a2) = %.2f, (b)/(c) = %.1fx (target >= 10x), with the medians of (a) and (b)
`, batch, batchedRate, batchedRate/copyRate, perRecordN, perRate, tmRate/batchedRate, tmRate/perRate)
			e.kc.Close()
		}
		fmt.Fprintf(os.Stderr, "\ningest, tidemark against COPY of the same rows:\n%s", summary.String())
	}
}

// medianOf returns the median of xs (the mean of the middle two for an
// even count).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// measureCopy copies the rows, as the ingester would store them, into an
// empty raw table in one COPY.
func (e *env) measureCopy(b *testing.B, recs []*kgo.Record) float64 {
	b.Helper()
	return e.measureCopyIn(b, recs, len(recs))
}

// measureCopyIn is measureCopy with one transaction (and COPY) per txRows
// rows: the cost of committing as often as tidemark's batches do.
func (e *env) measureCopyIn(b *testing.B, recs []*kgo.Record, txRows int) float64 {
	b.Helper()
	ctx := context.Background()
	_, conn := e.database(b)
	rows, times := decodedRows(b, recs)
	raw := raw.NewTable(source, config.PartitionDay)
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(times)); err != nil {
		b.Fatal(err)
	}
	prof := startProfile(b, e.srv, dbName(b, e.last))
	start, cpu := time.Now(), markCPU(b, e.servers()...)
	for i := 0; i < len(rows); i += txRows {
		// Outside a transaction, each COPY commits on its own.
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"raw", source},
			[]string{"event_id", "event_time", "ingested_at", "payload", "kafka_topic", "kafka_partition", "kafka_offset"},
			pgx.CopyFromRows(rows[i:min(i+txRows, len(rows))])); err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	e.cpu = cpu.since(b, e.servers()...)
	e.cpu.rows = int64(len(rows))
	prof.report(b, fmt.Sprintf("COPY into the raw table, %d rows a transaction", txRows))
	return float64(len(rows)) / took.Seconds()
}

// decodedRows decodes the records as tidemark would store them: the raw
// table's columns from event_id to kafka_offset, and the event times.
func decodedRows(b *testing.B, recs []*kgo.Record) ([][]any, []time.Time) {
	b.Helper()
	dec, err := decode.NewDecoder(&config.Source{EventID: "/event_id", EventTime: "/event_time", EventTimeFormat: config.TimeAuto,
		MaxAge: config.Duration(30 * 24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	rows := make([][]any, len(recs))
	times := make([]time.Time, len(recs))
	for i, r := range recs {
		r.Offset = int64(i)
		ev, rej := dec.Decode(r, benchNow)
		if rej != nil {
			b.Fatalf("record %d: %s", i, rej.Detail)
		}
		rows[i] = []any{ev.ID, ev.Time, benchNow, ev.Payload, r.Topic, r.Partition, r.Offset}
		times[i] = ev.Time
	}
	return rows, times
}

// measureTidemark drains the topic with one ingester, from start until
// every offset is stored. The rate excludes the group join and the first
// batch, reported separately.
func (e *env) measureTidemark(b *testing.B, end map[int32]int64, n int) (float64, time.Duration) {
	return e.measureGroup(b, end, n, 1, "bench-tidemark")
}

// measureGroup is measureTidemark with instances ingesters in one
// consumer group, started together.
func (e *env) measureGroup(b *testing.B, end map[int32]int64, n, instances int, group string) (float64, time.Duration) {
	b.Helper()
	dsn, conn := e.database(b)
	cfg, err := config.Parse("bench.yaml", []byte(configFor(dsn, e.kc.ListenAddrs()[0], group, e.sourceKeys)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	ins := make([]*kafka.Ingester, instances)
	regs := make([]*prometheus.Registry, instances)
	for i := range ins {
		regs[i] = prometheus.NewRegistry()
		if ins[i], err = kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return benchNow }, Registerer: regs[i]}); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, instances)
	prof := startProfile(b, e.srv, dbName(b, dsn))
	start := time.Now()
	var cpu cpuMark
	for _, in := range ins {
		go func() { done <- in.Run(ctx) }()
	}
	firstAt, firstRows := awaitWritten(b, regs, n, done, func() { cpu = markCPU(b, e.servers()...) })
	elapsed := time.Since(firstAt)
	// Over the same window as the rate: from the first committed batch on.
	e.cpu = cpu.since(b, e.servers()...)
	e.cpu.rows = int64(n) - firstRows
	prof.report(b, fmt.Sprintf("tidemark ingest, %d instance(s)", instances))
	var stored, rows int64
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(greatest(next_offset, 0)), 0)::bigint, coalesce(sum(rows_written), 0)::bigint
		FROM tidemark.kafka_offsets`).Scan(&stored, &rows)
	if err != nil {
		b.Fatal(err)
	}
	if stored != sumEnd(end) || rows != int64(n) {
		b.Fatalf("tidemark stored offsets up to %d of %d and wrote %d rows, want %d", stored, sumEnd(end), rows, n)
	}
	cancel()
	for range instances {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	return float64(int64(n)-firstRows) / elapsed.Seconds(), firstAt.Sub(start)
}

// awaitWritten waits until the ingesters of regs have committed n rows
// and returns when the first batch was seen committed and its rows; first
// runs then. Progress is read from the ingesters' own counters of
// committed rows, not from the warehouse: a query every few milliseconds
// would be work for the server that a baseline does not have. An
// ingester stopping (done) fails the benchmark.
func awaitWritten(b *testing.B, regs []*prometheus.Registry, n int, done <-chan error, first func()) (time.Time, int64) {
	b.Helper()
	var firstAt time.Time
	var firstRows int64
	for {
		rows := writtenRows(b, regs)
		if firstAt.IsZero() && rows > 0 {
			firstAt, firstRows = time.Now(), rows
			if first != nil {
				first()
			}
		}
		if rows >= int64(n) {
			return firstAt, firstRows
		}
		select {
		case err := <-done:
			b.Fatalf("an ingester stopped: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// writtenRows sums tidemark_ingest_rows_written_total over the
// ingesters' registries: the rows of every committed batch.
func writtenRows(b *testing.B, regs []*prometheus.Registry) int64 {
	b.Helper()
	var sum float64
	for _, reg := range regs {
		n, err := promreg.Sum(reg, "tidemark_ingest_rows_written_total")
		if err != nil {
			b.Fatal(err)
		}
		sum += n
	}
	return int64(sum)
}

// insertOneSQL is what a hand-written consumer typically runs per record.
const insertOneSQL = `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload, kafka_topic, kafka_partition, kafka_offset)
VALUES ($1, $2, now(), $3, $4, $5, $6) ON CONFLICT DO NOTHING`

// measurePerRecord runs the common hand-written consumer: poll, decode,
// INSERT each record in its own (autocommit) transaction, commit offsets
// to Kafka after each poll.
func (e *env) measurePerRecord(b *testing.B, n int) float64 {
	b.Helper()
	ctx := context.Background()
	_, conn := e.database(b)
	raw := raw.NewTable(source, config.PartitionDay)
	var starts []time.Time
	for d := 0; d <= 11; d++ {
		starts = append(starts, benchNow.AddDate(0, 0, -d))
	}
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(starts)); err != nil {
		b.Fatal(err)
	}
	dec, err := decode.NewDecoder(&config.Source{EventID: "/event_id", EventTime: "/event_time", EventTimeFormat: config.TimeAuto,
		MaxAge: config.Duration(30 * 24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kc.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumerGroup("bench-per-record"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var start time.Time
	done := 0
	for done < n {
		fetches := cl.PollRecords(ctx, min(500, n-done))
		if start.IsZero() {
			start = time.Now()
		}
		for _, r := range fetches.Records() {
			ev, rej := dec.Decode(r, benchNow)
			if rej != nil {
				b.Fatal(rej.Detail)
			}
			if _, err := conn.Exec(ctx, insertOneSQL, ev.ID, ev.Time, ev.Payload, r.Topic, r.Partition, r.Offset); err != nil {
				b.Fatal(err)
			}
			done++
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return float64(done) / time.Since(start).Seconds()
}

// rssTarget is the peak resident memory BenchmarkDrainRSS aims for at
// the defaults; rssSlack is what a process may take beyond
// ingest.memory_max_bytes whatever its records: the runtime's reserve
// (16 MiB) and the binary's pages (about 26 MiB), with room.
const (
	rssTarget = 64 << 20
	rssSlack  = 48 << 20
)

// BenchmarkDrainRSS runs `tidemark run` as its own process with the
// default configuration against backlogs of records of every size and
// reports its peak resident memory for each: 2M records of about 200
// bytes on 4 partitions, 200 records of 1 MB on one, and 1M records of
// about 200 bytes on 64.
func BenchmarkDrainRSS(b *testing.B) {
	n := size("TIDEMARK_BENCH_BACKLOG", 2_000_000, 200_000)
	bin := filepath.Join(b.TempDir(), "tidemark")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tidemark")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	budget := memoryBudget(b)
	e := &env{srv: durableServer(b)}
	for i := 0; i < b.N; i++ {
		for _, c := range []struct {
			name, metric string
			parts        int32
			recs         func() []*kgo.Record
		}{
			{"records of ~200 bytes, 4 partitions", "peak_rss_MiB", parts, func() []*kgo.Record { r, _ := workload(n); return r }},
			{"records of 1 MB, 1 partition", "peak_rss_1MB_MiB", 1, func() []*kgo.Record { return largeRecords(200, 1_000_000) }},
			{"records of ~200 bytes, 64 partitions", "peak_rss_64parts_MiB", 64, func() []*kgo.Record { r, _ := workloadOn(n/2, 64); return r }},
		} {
			e.kc = newCluster(b, c.parts)
			recs := c.recs()
			count := len(recs)
			end := e.produce(b, recs)
			recs = nil
			runtime.GC()
			peak, rate := e.drain(b, bin, end, count)
			e.kc.Close()
			b.ReportMetric(float64(peak)/(1<<20), c.metric)
			bound, what := int64(budget+rssSlack), "ingest.memory_max_bytes + 48 MiB"
			if c.metric == "peak_rss_MiB" {
				bound, what = rssTarget, "the target"
				b.ReportMetric(rate, "rows/s")
			}
			fmt.Fprintf(os.Stderr, "\ndraining %d %s with `tidemark run` at the defaults: peak RSS %.0f MiB (%s: %d MiB), %.0f rows/s including start-up\n",
				count, c.name, float64(peak)/(1<<20), what, bound>>20, rate)
		}
	}
}

// memoryBudget is ingest.memory_max_bytes in these benchmarks.
func memoryBudget(b *testing.B) int {
	b.Helper()
	cfg, err := config.Parse("bench.yaml", []byte(configFor("postgres://localhost/x", "localhost:9092", "g", "")),
		func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	return int(cfg.Ingest.MemoryMaxBytes)
}

// largeRecords returns n events of about size bytes each, on partition 0.
func largeRecords(n, size int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	pad := strings.Repeat("0123456789abcdef", size/16)
	for i := range recs {
		v := fmt.Sprintf(`{"event_id":"big-%d","event_time":%q,"pad":"%s"}`, i, benchNow.Add(-time.Hour).Format(time.RFC3339), pad)
		recs[i] = &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)}
	}
	return recs
}

// drain runs bin against a fresh warehouse until the records up to end
// are stored, and returns its peak resident memory and its rate.
func (e *env) drain(b *testing.B, bin string, end map[int32]int64, n int) (int64, float64) {
	b.Helper()
	dsn, conn := e.database(b)
	cfgPath := filepath.Join(b.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(cfgPath, []byte(configFor(dsn, e.kc.ListenAddrs()[0], "bench-rss", "")), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if waitfor.Poll(30*time.Minute, func() bool {
		var stored int64
		if err := conn.QueryRow(context.Background(), `SELECT coalesce(sum(greatest(next_offset, 0)), 0)::bigint
			FROM tidemark.kafka_offsets`).Scan(&stored); err != nil && !strings.Contains(err.Error(), "does not exist") {
			b.Fatal(err)
		}
		return stored >= sumEnd(end)
	}) != nil {
		b.Fatalf("backlog not drained in 30 minutes\n%s", out.String())
	}
	elapsed := time.Since(start)
	// VmHWM is the peak resident set of the process since it started
	// its program. (The rusage maximum of a child also counts the
	// parent's pages shared before exec, here the benchmark's broker.)
	peak, err := vmHWM(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("tidemark run: %v\n%s", err, out.String())
	}
	return peak, float64(n) / elapsed.Seconds()
}

// vmHWM reads a process's peak resident set size in bytes.
func vmHWM(pid int) (int64, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

func sumEnd(end map[int32]int64) int64 {
	var s int64
	for _, e := range end {
		s += e
	}
	return s
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
