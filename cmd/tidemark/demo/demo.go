// Package demo runs tidemark end to end with nothing installed but Go and
// the PostgreSQL server binaries: an embedded Kafka-protocol broker
// (kfake), a throwaway PostgreSQL, and the service itself with its clock
// set to the ingestion times of a worked example, so that the output is the
// same on every run.
package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/history"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/service"
	"github.com/tidemark-dev/tidemark/status"
)

const topic = "app-events"

func at(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// Options customise a demonstration.
type Options struct {
	// Logger receives the service log; nil discards it.
	Logger *slog.Logger
	// Serve keeps the service, and its status page, running at the end
	// until ctx is cancelled.
	Serve bool
	// Citus puts the warehouse on a Citus cluster of a coordinator and
	// two workers, started like the single server; it needs the citus
	// extension installed for the PostgreSQL server binaries.
	Citus bool
}

// Run runs the demonstration, writing what happens to out.
func Run(ctx context.Context, out io.Writer, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fmt.Fprintln(out, "tidemark demo: an embedded Kafka broker, a throwaway PostgreSQL, and the service in between.")
	fmt.Fprintln(out)
	pg, kc, stop, err := startServers(ctx, out, opts.Citus)
	if err != nil {
		return err
	}
	defer stop()
	defer kc.Close()
	cfg, err := demoConfig(out, pg, kc.ListenAddrs()[0])
	if err != nil {
		return err
	}

	clk := clock.New(historyFrom)
	svcCtx, stopSvc := context.WithCancel(ctx)
	defer stopSvc()
	addrCh := make(chan string, 1)
	svcErr := make(chan error, 1)
	go func() {
		// The demo runs the reconciler itself, once per step, to show
		// what each run does; `tidemark run` would run it on a timer.
		svcErr <- service.Run(svcCtx, cfg, service.Options{Logger: log, Now: clk.Now, Only: []string{service.ComponentIngest},
			Listening: func(a string) { addrCh <- a }})
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case err := <-svcErr:
		return fmt.Errorf("service: %w", err)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("service did not start within 60s")
	}

	pool, err := pgxpool.New(ctx, pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer pool.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()[0]), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer prod.Close()
	rec, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Now: clk.Now})
	if err != nil {
		return err
	}
	d := &run{ctx: ctx, out: out, pool: pool, prod: prod, clk: clk, end: map[int32]int64{}, rec: rec, log: log, citus: opts.Citus}
	if err := d.parts(cfg, pg.URL("app"), addr); err != nil {
		return err
	}
	if opts.Serve {
		fmt.Fprintf(out, "\nstatus page: http://%s/ (the partition grid, the lateness of app_events and the arrival curve of\n", addr)
		fmt.Fprintln(out, "daily_sales, at the demo's clock); press Ctrl-C to stop.")
		<-ctx.Done()
	} else {
		fmt.Fprintln(out, "\n`tidemark demo --serve` keeps the service running at the end, with its status page at /, until Ctrl-C.")
	}
	stopSvc()
	if err := <-svcErr; err != nil {
		return fmt.Errorf("service: %w", err)
	}
	fmt.Fprintln(out, "\ndone: the service committed its last batch, left the consumer group and stopped.")
	return nil
}

// startServers starts PostgreSQL (one server, or a Citus cluster whose
// coordinator it returns), with the source database app, and the Kafka
// broker with the demo's topic; the caller stops them, PostgreSQL with the
// function returned.
func startServers(ctx context.Context, out io.Writer, onCitus bool) (*pgserver.Server, *kfake.Cluster, func(), error) {
	bin, err := pgserver.FindBinDir()
	if err != nil {
		return nil, nil, nil, err
	}
	var pg *pgserver.Server
	var stop func()
	if onCitus {
		fmt.Fprintf(out, "starting a Citus cluster from %s:\n", bin)
		if pg, stop, err = startCluster(ctx, out); err != nil {
			return nil, nil, nil, err
		}
	} else {
		fmt.Fprintf(out, "starting PostgreSQL from %s ... ", bin)
		if pg, err = pgserver.Start(ctx, pgserver.Options{}); err != nil {
			return nil, nil, nil, err
		}
		stop = func() { _ = pg.Stop() }
		fmt.Fprintf(out, "listening on %s:%d\n", pg.Host, pg.Port)
	}
	admin, err := pgxpool.New(ctx, pg.URL("postgres"))
	if err == nil {
		_, err = admin.Exec(ctx, "CREATE DATABASE app")
		admin.Close()
	}
	if err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("create the source database: %w", err)
	}
	fmt.Fprint(out, "starting Kafka (kfake) ... ")
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("start kfake: %w", err)
	}
	fmt.Fprintf(out, "listening on %s, topic %s with 2 partitions\n\n", kc.ListenAddrs()[0], topic)
	return pg, kc, stop, nil
}

// demoConfig is the demo's configuration, printed as it is read.
func demoConfig(out io.Writer, pg *pgserver.Server, broker string) (*config.Config, error) {
	yaml := fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka:
  brokers: [%q]
  group: tidemark-demo
  session_timeout: 2s
ingest: {batch_max_age: 20ms}
sources:
  app_events:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at}
    mirror: {table: dw_customers, deletes: soft}
  shop:
    cdc: {dsn: %q, tables: [orders]}
    mirror: {table: dw_orders, deletes: hard}
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date, time_zone: UTC}
    lateness_horizon: 72h
    beyond_horizon: correction
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total,
             count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, pg.URL("postgres"), broker, topic, pg.URL("app"), pg.URL("app"))
	cfg, err := config.Parse("demo.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(out, "configuration (demo.yaml):")
	for _, line := range strings.Split(strings.TrimSpace(yaml), "\n") {
		fmt.Fprintln(out, "  "+line)
	}
	fmt.Fprintln(out)
	return cfg, nil
}

// parts runs the demo's parts in order: the history and the worked
// example, what they left in the warehouse, the polled table, the CDC
// source, on Citus where the tables are, `tidemark status` and a few
// series of /metrics at addr.
func (d *run) parts(cfg *config.Config, srcURL, addr string) error {
	if err := d.history(); err != nil {
		return err
	}
	if err := d.workedExample(); err != nil {
		return err
	}
	if err := d.show(); err != nil {
		return err
	}
	if err := d.completeness(cfg); err != nil {
		return err
	}
	src, err := pgxpool.New(d.ctx, srcURL)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := d.pollPart(cfg, src); err != nil {
		return err
	}
	if err := d.cdcPart(cfg, src); err != nil {
		return err
	}
	if d.citus {
		if err := d.cluster(); err != nil {
			return err
		}
	}
	if err := d.status(cfg); err != nil {
		return err
	}
	return d.metrics(addr)
}

// workedExample replays the lesson's worked example, the service clock at
// each event's ingestion time, with a reconcile run after each step.
func (d *run) workedExample() error {
	d.clk.Set(at("2026-10-04 22:01"))
	fmt.Fprintln(d.out, "The service clock follows the ingestion times of the worked example (UTC); after each step the")
	fmt.Fprintln(d.out, "reconciler runs once and rebuilds the daily_sales partitions that the new rows touched:")
	steps := []struct {
		clock string
		what  string
		recs  []*kgo.Record
	}{
		{"2026-10-04 22:01", "e1 happened at 22:00 on 4 October (10.00)", []*kgo.Record{
			event(0, "e1", "2026-10-04T22:00:00Z", "10.00")}},
		{"2026-10-05 08:00", "e2 happened at 08:00 on 5 October (20.00), and the producer retried it", []*kgo.Record{
			event(1, "e2", "2026-10-05T08:00:00Z", "20.00"), event(0, "e2", "2026-10-05T08:00:00Z", "20.00")}},
		{"2026-10-05 09:15", "e3 happened at 23:30 on 4 October (5.00): it arrives late", []*kgo.Record{
			event(1, "e3", "2026-10-04T23:30:00Z", "5.00")}},
		{"2026-10-05 09:16", "three bad messages: truncated JSON, no event_id, an event time in 1970", []*kgo.Record{
			{Topic: topic, Partition: 0, Key: []byte("bad-1"), Value: []byte(`{"event_id":"e4","event_ti`)},
			{Topic: topic, Partition: 1, Key: []byte("bad-2"), Value: []byte(`{"id":"e5","event_time":"2026-10-05T09:00:00Z","amount":"1.00"}`)},
			{Topic: topic, Partition: 0, Key: []byte("bad-3"), Value: []byte(`{"event_id":"e6","event_time":0,"amount":"1.00"}`)}}},
		{"2026-10-05 09:20", "e0 happened at 12:00 on 1 October (99.00): 81 hours after its day ended, beyond the 72h horizon", []*kgo.Record{
			event(0, "e0", "2026-10-01T12:00:00Z", "99.00")}},
		{"2026-10-05 10:00", "nothing new arrives; the reconciler runs again", nil},
	}
	for _, s := range steps {
		d.clk.Set(at(s.clock))
		fmt.Fprintf(d.out, "  [%s] %s\n", s.clock, s.what)
		if err := d.produceAndWait(s.recs); err != nil {
			return err
		}
		if err := d.reconcile(); err != nil {
			return err
		}
	}
	fmt.Fprintln(d.out)
	return nil
}

// status prints `tidemark status` as it reads now.
func (d *run) status(cfg *config.Config) error {
	rep, err := status.Gather(d.ctx, d.pool, cfg, kadm.NewClient(d.prod), d.clk.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(d.out, "`tidemark status`:")
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(text.String(), "\n"), "\n") {
		fmt.Fprintln(d.out, "  "+line)
	}
	fmt.Fprintln(d.out)
	return nil
}

func event(part int32, id, ts, amount string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: part, Key: []byte(id),
		Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":%q,"amount":%q}`, id, ts, amount))}
}

type run struct {
	ctx  context.Context
	out  io.Writer
	pool *pgxpool.Pool
	prod *kgo.Client
	clk  *clock.Settable
	end  map[int32]int64
	rec  *reconcile.Reconciler
	log  *slog.Logger
	// citus: the warehouse is a Citus coordinator.
	citus bool
}

// History is the simulated history the demo loads before the worked
// example: sales from historyFrom to historyTo, arriving by historyNow.
var (
	historyFrom = at("2026-09-20 00:00")
	historyTo   = at("2026-10-04 00:00")
	historyNow  = at("2026-10-04 22:00")
)

// history loads two weeks of simulated sales, arriving late in a
// realistic mix, with the service clock at each batch's arrival, and
// reconciles them: the final partitions the completeness estimate learns
// from.
func (d *run) history() error {
	evs := history.Sales("h", historyFrom, historyTo, historyNow, 12)
	batches := history.Batches(evs)
	fmt.Fprintf(d.out, "First, two weeks of history: %d simulated sales from %s to %s (IDs h0001...), produced in %d batches\n",
		len(evs), historyFrom.Format("2 January"), historyTo.AddDate(0, 0, -1).Format("2 January"), len(batches))
	fmt.Fprintln(d.out, "with the service clock at their arrival, every three hours: most within hours, some a day later, one in")
	fmt.Fprintln(d.out, "twelve after more than three days. The reconciler learns from the final days how fast a day fills up.")
	for _, b := range batches {
		d.clk.Set(b[0].Arrives)
		recs := make([]*kgo.Record, len(b))
		for i, e := range b {
			recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % 2), Key: []byte(e.ID), Value: e.JSON()}
		}
		if err := d.produceAndWait(recs); err != nil {
			return err
		}
	}
	d.clk.Set(historyNow)
	rep, err := d.rec.RunOnce(d.ctx, "daily_sales", true)
	if err != nil {
		return err
	}
	var beyond int64
	if err := d.pool.QueryRow(d.ctx, "SELECT count(*) FROM tidemark.corrections").Scan(&beyond); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  [%s] reconcile: rebuilt %d partitions (%s .. %s); %d late event(s) beyond the 72h horizon recorded\n\n",
		historyNow.Format("2006-01-02 15:04"), len(rep.Rebuilt), rep.Rebuilt[len(rep.Rebuilt)-1], rep.Rebuilt[0], beyond)
	return nil
}

// completeness prints the completeness estimate of the partitions that are
// not final, explained from the arrival curve, and the lateness of the
// source's events.
func (d *run) completeness(cfg *config.Config) error {
	curve, err := lateness.Curve(d.ctx, d.pool, "daily_sales", lateness.HistoryPartitions("day"))
	if err != nil {
		return err
	}
	rows, err := d.pool.Query(d.ctx, `SELECT partition_key, state, extract(epoch FROM $1::timestamptz - partition_end)::float8, completeness
		FROM tidemark.partitions WHERE aggregate = 'daily_sales' AND state NOT IN ('final', 'archived') AND completeness IS NOT NULL
		ORDER BY partition_start DESC`, d.clk.Now())
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintf(d.out, "completeness of the daily_sales partitions that are not final, as of %s: the share of a day's events\n", d.clk.Now().Format("2006-01-02 15:04"))
	fmt.Fprintf(d.out, "already loaded, estimated from the arrival history of the %d latest final days:\n", curve.Partitions)
	for rows.Next() {
		var key, state string
		var age, c float64
		if err := rows.Scan(&key, &state, &age, &c); err != nil {
			return err
		}
		when := lateness.Format(time.Duration(age)*time.Second) + " after its end"
		if age < 0 {
			when = lateness.Format(time.Duration(-age)*time.Second) + " before its end"
		}
		fmt.Fprintf(d.out, "  %s  %-6s  %6s complete: %s of a final day's events had arrived %s, on average\n",
			key, state, lateness.Percent(c), lateness.Percent(c), when)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	until := d.clk.Now()
	rep, err := lateness.Measure(d.ctx, d.pool, cfg, "app_events", lateness.Options{Since: until.Add(-14 * 24 * time.Hour), Until: until})
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "\n`tidemark lateness --source app_events --since 14d --until %q`: the evidence for the horizon\n", until.Format("2006-01-02 15:04Z07:00"))
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(text.String(), "\n"), "\n") {
		fmt.Fprintln(d.out, "  "+line)
	}
	fmt.Fprintln(d.out)
	return nil
}

// reconcile runs the reconciler once and says what it rebuilt.
func (d *run) reconcile() error {
	rep, err := d.rec.RunOnce(d.ctx, "daily_sales", true)
	if err != nil {
		return err
	}
	var beyond int64
	if err := d.pool.QueryRow(d.ctx, "SELECT count(*) FROM tidemark.corrections WHERE event_key NOT LIKE 'h%'").Scan(&beyond); err != nil {
		return err
	}
	what := "nothing to rebuild"
	if len(rep.Rebuilt) > 0 {
		what = "rebuilt " + strings.Join(rep.Rebuilt, ", ")
	}
	fmt.Fprintf(d.out, "               reconcile: %s (load watermark xid %s, %d event(s) beyond the horizon recorded)\n",
		what, rep.Watermark, beyond)
	return nil
}

// produceAndWait produces records and waits until the warehouse has stored
// offsets past them.
func (d *run) produceAndWait(recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	res := d.prod.ProduceSync(d.ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	for _, r := range res {
		d.end[r.Record.Partition] = max(d.end[r.Record.Partition], r.Record.Offset+1)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		done := true
		for part, end := range d.end {
			var next int64
			err := d.pool.QueryRow(d.ctx, `SELECT coalesce(max(next_offset), -1) FROM tidemark.kafka_offsets
				WHERE consumer_group = 'tidemark-demo' AND topic = $1 AND partition = $2`, topic, part).Scan(&next)
			if err != nil || next < end {
				done = false
			}
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("records were not ingested within 60s")
		}
		select {
		case <-d.ctx.Done():
			return d.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *run) table(title, sql string) error {
	rows, err := d.pool.Query(d.ctx, sql)
	if err != nil {
		return fmt.Errorf("%s: %w", title, err)
	}
	defer rows.Close()
	fmt.Fprintln(d.out, title)
	tw := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	var cols []string
	for _, f := range rows.FieldDescriptions() {
		cols = append(cols, f.Name)
	}
	fmt.Fprintln(tw, "  "+strings.Join(cols, "\t"))
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return err
		}
		cells := make([]string, len(vals))
		for i, v := range vals {
			cells[i] = fmt.Sprint(v)
			if v == nil {
				cells[i] = "-"
			}
		}
		fmt.Fprintln(tw, "  "+strings.Join(cells, "\t"))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(d.out)
	return nil
}

func (d *run) show() error {
	for _, t := range []struct{ title, sql string }{
		{"raw.app_events (the history's rows left out): one row per distinct event, stamped with the service clock; the retry of e2 was dropped", `
SELECT event_id,
       to_char(event_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS event_time,
       to_char(ingested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS ingested_at,
       (ingested_at - event_time)::text AS arrival_delay,
       payload->>'amount' AS amount,
       kafka_partition || '/' || kafka_offset AS "partition/offset"
FROM raw.app_events WHERE event_id NOT LIKE 'h%' ORDER BY event_id`},
		{"raw partitions, one per event date (UTC), created around the present and for late dates on demand:", `
SELECT c.relname AS partition, pg_get_expr(c.relpartbound, c.oid) AS bounds
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'raw.app_events'::regclass ORDER BY 1`},
		{"tidemark.ingest_ledger (the worked example's loads): what each load transaction wrote, per UTC hour of event time (the reconciler reads this, not the raw rows)", `
SELECT load_xid, to_char(bucket AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS bucket, rows,
       to_char(ingested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS ingested_at
FROM tidemark.ingest_ledger WHERE ingested_at > '2026-10-04 22:00+00' ORDER BY id`},
		{"tidemark.dead_letters: bad input with its original bytes and the reason", `
SELECT reason, topic || '/' || partition || '/' || "offset" AS coordinates,
       convert_from(record_key, 'UTF8') AS key, convert_from(record_value, 'UTF8') AS value
FROM tidemark.dead_letters ORDER BY id`},
		{"daily_sales since 29 September: the aggregate, rebuilt partition by partition (4 October twice: e3 arrived late)", `
SELECT sale_date::text, total::text, event_count FROM daily_sales WHERE sale_date >= '2026-09-29' ORDER BY 1`},
		{"tidemark.partitions since 29 September: each partition's state, rows, rebuilds, completeness and when its numbers become final", `
SELECT partition_key AS partition, state, rows, rebuilds, round(completeness::numeric * 100, 1) || '%' AS completeness,
       to_char(rebuilt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS rebuilt_at,
       to_char(final_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS final_at
FROM tidemark.partitions WHERE partition_start >= '2026-09-29' ORDER BY partition_start`},
		{"tidemark.corrections (the worked example's): events that arrived after their partition's horizon (the partition stays final)", `
SELECT aggregate, event_key, to_char(event_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS event_time,
       to_char(ingested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS ingested_at, event->'payload'->>'amount' AS amount
FROM tidemark.corrections WHERE event_key NOT LIKE 'h%' ORDER BY id`},
		{"tidemark.kafka_offsets: next offsets, stored in the same transactions as the rows", `
SELECT topic || '/' || partition AS partition, next_offset, rows_written, duplicates, dead_letters,
       to_char(max_event_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS max_event_time
FROM tidemark.kafka_offsets ORDER BY topic, partition`},
	} {
		if err := d.table(t.title, t.sql); err != nil {
			return err
		}
	}
	return nil
}

// metrics prints the service's own series from /metrics.
func (d *run) metrics(addr string) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return fmt.Errorf("fetch /metrics: %w", err)
	}
	defer resp.Body.Close()
	fmt.Fprintf(d.out, "a few series from http://%s/metrics:\n", addr)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "tidemark_ingest_rows_written_total") ||
			strings.HasPrefix(line, "tidemark_ingest_duplicates_total") ||
			(strings.HasPrefix(line, "tidemark_ingest_dead_letters_total") && !strings.HasSuffix(line, " 0")) ||
			strings.HasPrefix(line, "tidemark_source_event_time_watermark_seconds") ||
			strings.HasPrefix(line, "tidemark_ingest_consumer_lag_records") ||
			strings.HasPrefix(line, "tidemark_reconcile_load_watermark_age_seconds") {
			fmt.Fprintln(d.out, "  "+line)
		}
	}
	return sc.Err()
}
