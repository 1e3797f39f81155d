package reconcile

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/raw"
)

const (
	// movingPartitionsSQL counts the open and closed partitions (zero
	// included) of each aggregate of $1 through the partial index
	// partitions_moving, which holds only those.
	movingPartitionsSQL = `
SELECT a.name, s.state, (SELECT count(*) FROM tidemark.partitions p
                         WHERE p.aggregate = a.name AND p.state = s.state AND p.state IN ('open', 'closed'))
FROM unnest($1::text[]) a (name) CROSS JOIN (VALUES ('open'), ('closed')) s (state)`

	watermarkAgesSQL = `SELECT aggregate, advanced_at FROM tidemark.load_watermarks WHERE advanced_at IS NOT NULL`

	// oldestTransactionSQL times the transaction with the oldest id among
	// running and prepared ones (the one that status shows): it is what
	// holds every load watermark back.
	oldestTransactionSQL = `
SELECT coalesce((SELECT extract(epoch FROM now() - started)::float8 FROM (
    SELECT backend_xid AS xid, xact_start AS started FROM pg_stat_activity WHERE backend_xid IS NOT NULL
    UNION ALL
    SELECT transaction, prepared FROM pg_prepared_xacts
) t ORDER BY age(xid) DESC LIMIT 1), 0)`
)

// Collector exports, at scrape time, how far each aggregate's load
// watermark lags (service time since it last moved), how many of its
// partitions are open and closed, and the age of the warehouse's oldest
// transaction, which holds the watermarks back.
type Collector struct {
	q      raw.Querier
	now    func() time.Time
	names  []string
	age    *prometheus.Desc
	oldest *prometheus.Desc
	moving *prometheus.Desc
}

// NewCollector returns the collector of the aggregates named names; now is
// the service clock.
func NewCollector(q raw.Querier, now func() time.Time, names []string) *Collector {
	return &Collector{q: q, now: now, names: names,
		age: prometheus.NewDesc("tidemark_reconcile_load_watermark_age_seconds",
			"Service time since the aggregate's load watermark last moved.", []string{"aggregate"}, nil),
		oldest: prometheus.NewDesc("tidemark_warehouse_oldest_transaction_seconds",
			"Age of the warehouse transaction (running or prepared) with the oldest transaction id; load watermarks cannot pass it.", nil, nil),
		moving: prometheus.NewDesc("tidemark_partitions",
			"Partitions of the aggregate in the state: open (event time has not passed their end) or closed (it has; their numbers may still change). Final partitions are not counted.",
			[]string{"aggregate", "state"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.age
	ch <- c.oldest
	ch <- c.moving
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.q.Query(ctx, watermarkAgesSQL)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.age, err)
		return
	}
	now := c.now()
	for rows.Next() {
		var name string
		var at time.Time
		if err := rows.Scan(&name, &at); err != nil {
			rows.Close()
			ch <- prometheus.NewInvalidMetric(c.age, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, max(0, now.Sub(at).Seconds()), name)
	}
	rows.Close()
	if err := c.collectMoving(ctx, ch); err != nil {
		ch <- prometheus.NewInvalidMetric(c.moving, err)
	}
	var oldest float64
	r, err := c.q.Query(ctx, oldestTransactionSQL)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.oldest, err)
		return
	}
	defer r.Close()
	if r.Next() {
		if err := r.Scan(&oldest); err != nil {
			ch <- prometheus.NewInvalidMetric(c.oldest, err)
			return
		}
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, oldest)
}

// collectMoving sends the open and closed partition counts.
func (c *Collector) collectMoving(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.q.Query(ctx, movingPartitionsSQL, c.names)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name, state string
		var n int64
		if err := rows.Scan(&name, &state, &n); err != nil {
			return err
		}
		ch <- prometheus.MustNewConstMetric(c.moving, prometheus.GaugeValue, float64(n), name, state)
	}
	return rows.Err()
}
