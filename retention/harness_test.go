package retention_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// at parses "2006-01-02 15:04" as UTC.
func at(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		panic(err)
	}
	return t
}

// warehouse is a migrated warehouse with the raw table of one Kafka
// source, app_events, and one aggregate over it, daily_sales, on a
// service clock the test sets. Events are loaded as a load transaction of
// the ingester writes them: raw rows and their ledger row at once.
type warehouse struct {
	t     *testing.T
	pool  *pgxpool.Pool
	clock *clock.Settable
	cfg   *config.Config
	raw   *raw.Table
}

// newWarehouse prepares daily_sales (of beyond_horizon policy, horizon
// 72h) on a fresh warehouse at 2026-10-01 00:00, whose raw partitions
// around that time are created as an ingester starting then creates them.
func newWarehouse(t *testing.T, policy string) *warehouse {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	// The broker is never reached: nothing here reads from Kafka.
	yaml := fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: ["127.0.0.1:9"], group: retention-test}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 365d
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date, time_zone: UTC}
    lateness_horizon: 72h
    beyond_horizon: %s
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1
`, dsn, policy)
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	w := &warehouse{t: t, pool: pool, clock: clock.New(at("2026-10-01 00:00")), cfg: cfg,
		raw: raw.NewTable("app_events", cfg.Sources["app_events"].RawPartition)}
	ctx := context.Background()
	if err := w.reconciler().Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	w.onConn(func(conn *pgx.Conn) error { return w.raw.Precreate(ctx, conn, w.clock.Now()) })
	return w
}

// onConn runs f on a connection of the pool.
func (w *warehouse) onConn(f func(*pgx.Conn) error) {
	w.t.Helper()
	conn, err := w.pool.Acquire(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Release()
	if err := f(conn.Conn()); err != nil {
		w.t.Fatal(err)
	}
}

// loadAt sets the service clock to ingested ("2006-01-02 15:04") and loads
// a sale of amount with event time eventTime (RFC 3339), creating its raw
// partition first when it is missing.
func (w *warehouse) loadAt(ingested, id, eventTime string, amount int) {
	w.t.Helper()
	w.clock.Set(at(ingested))
	et, err := time.Parse(time.RFC3339, eventTime)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx := context.Background()
	w.onConn(func(conn *pgx.Conn) error {
		if err := w.raw.EnsurePartitions(ctx, conn, w.raw.Missing([]time.Time{et})); err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
				VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'event_time', $2::timestamptz, 'amount', $4::int))`,
				id, et, w.clock.Now(), amount); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, raw.InsertLedgerSQL, w.clock.Now(), []string{"app_events"},
				[]time.Time{et.Truncate(time.Hour)}, []int64{1}, []time.Time{et}, []time.Time{et})
			return err
		})
	})
}

// reconciler builds a reconciler of the configuration on the clock.
func (w *warehouse) reconciler() *reconcile.Reconciler {
	w.t.Helper()
	r, err := reconcile.New(w.cfg, w.pool, reconcile.Options{Now: w.clock.Now, Logger: testLogger()})
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

// reconcile runs daily_sales's reconciliation once.
func (w *warehouse) reconcile(r *reconcile.Reconciler) {
	w.t.Helper()
	if _, err := r.RunOnce(context.Background(), "daily_sales", true); err != nil {
		w.t.Fatalf("reconcile: %v", err)
	}
}

// salesUntilThe6th loads one sale a day on 1 to 6 October at noon, each
// reconciled as it arrives, and configures raw rows to be kept 3 days and
// ledger rows 1 day.
func (w *warehouse) salesUntilThe6th() {
	w.t.Helper()
	w.cfg.Sources["app_events"].Retention.Raw = config.Duration(3 * 24 * time.Hour)
	w.cfg.Retention.Ledger = config.Duration(24 * time.Hour)
	r := w.reconciler()
	for d := 1; d <= 6; d++ {
		day := fmt.Sprintf("2026-10-%02d", d)
		w.loadAt(day+" 12:00", fmt.Sprintf("e%d", d), day+"T11:00:00Z", d*10)
		w.reconcile(r)
	}
}

// pruner builds a pruner of the configuration on the clock, with its own
// registry.
func (w *warehouse) pruner(opts ...func(*retention.Options)) (*retention.Pruner, *prometheus.Registry) {
	w.t.Helper()
	reg := prometheus.NewRegistry()
	o := retention.Options{Now: w.clock.Now, Registerer: reg, Logger: testLogger()}
	for _, f := range opts {
		f(&o)
	}
	p, err := retention.New(w.cfg, w.pool, o)
	if err != nil {
		w.t.Fatal(err)
	}
	return p, reg
}

// prune runs p once.
func (w *warehouse) prune(p *retention.Pruner, dryRun bool) *retention.Report {
	w.t.Helper()
	rep, err := p.Run(context.Background(), dryRun)
	if err != nil {
		w.t.Fatalf("prune (dry run %v): %v", dryRun, err)
	}
	return rep
}

// exec runs statements on the warehouse.
func (w *warehouse) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.pool.Exec(context.Background(), sql, args...); err != nil {
		w.t.Fatal(err)
	}
}

// rows returns a query's rows, each formatted as "a | b | c".
func (w *warehouse) rows(sql string, args ...any) []string {
	w.t.Helper()
	return pgtest.Lines(w.t, w.pool, sql, args...)
}

// table is the report's entry for table name.
func table(rep *retention.Report, name string) retention.Table {
	for _, t := range rep.Tables {
		if t.Name == name {
			return t
		}
	}
	return retention.Table{Name: name}
}

// testLogger discards, unless TIDEMARK_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("TIDEMARK_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
