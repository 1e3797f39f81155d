package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/lateness"
)

// Options customise a Pruner beyond its configuration.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the service clock: every retention is measured on it.
	// Default time.Now.
	Now func() time.Time
}

// Pruner removes what the retention of a configuration no longer keeps.
type Pruner struct {
	cfg  *config.Config
	pool *pgxpool.Pool
	log  *slog.Logger
	now  func() time.Time
	m    *metrics
	aggs map[string]*aggregate.Definition // the configuration's, by name
}

// view is whose needs one run keeps: per source, the aggregates of the
// configuration and those the warehouse has registered (see
// aggregate.Registry) that the configuration does not name, which an
// instance with another configuration may be reconciling, or which may
// return. A configured aggregate's horizon is the longer of the
// configuration's and the registered one.
type view struct {
	bySource map[string][]*aggregate.Definition
	// absent are the registered aggregates the configuration does not
	// name; those registered without a definition have no Calendar.Loc.
	absent map[string]bool
}

// names lists the aggregates of source.
func (v view) names(source string) []string {
	var out []string
	for _, d := range v.bySource[source] {
		out = append(out, d.Name)
	}
	return out
}

// who names aggregate d for a reason retention gives.
func (v view) who(d *aggregate.Definition) string {
	if v.absent[d.Name] {
		return fmt.Sprintf("aggregate %s (not in this configuration: add it back, or remove its state with tidemark forget --aggregate %s)", d.Name, d.Name)
	}
	return "aggregate " + d.Name
}

// view reads the registry and merges it with the configuration.
func (p *Pruner) view(ctx context.Context, conn *pgx.Conn) (view, error) {
	v := view{bySource: map[string][]*aggregate.Definition{}, absent: map[string]bool{}}
	reg, err := aggregate.Registry(ctx, conn)
	if err != nil {
		return v, fmt.Errorf("prune: %w", err)
	}
	seen := map[string]bool{}
	for _, r := range reg {
		d := p.aggs[r.Name]
		switch {
		case d != nil && d.Source == r.Source:
			c := *d
			if r.Defined && r.Horizon > c.Horizon {
				c.Horizon = r.Horizon
			}
			d = &c
		case d != nil:
			// Configured over another source, which prepare refuses:
			// the registered one's needs are kept.
			d = &aggregate.Definition{Name: r.Name, Source: r.Source, Calendar: r.Calendar, Horizon: r.Horizon, Policy: r.Policy}
		default:
			v.absent[r.Name] = true
			d = &aggregate.Definition{Name: r.Name, Source: r.Source, Calendar: r.Calendar, Horizon: r.Horizon, Policy: r.Policy}
		}
		seen[r.Name] = true
		v.bySource[d.Source] = append(v.bySource[d.Source], d)
	}
	for _, name := range p.cfg.AggregateNames() {
		if d := p.aggs[name]; !seen[name] {
			v.bySource[d.Source] = append(v.bySource[d.Source], d)
		}
	}
	return v, nil
}

// New returns the pruner of cfg.
func New(cfg *config.Config, pool *pgxpool.Pool, opts Options) (*Pruner, error) {
	opts = opts.withDefaults()
	p := &Pruner{cfg: cfg, pool: pool, log: opts.Logger.With("component", "prune"), now: opts.Now, aggs: map[string]*aggregate.Definition{}}
	for _, name := range cfg.AggregateNames() {
		d, err := aggregate.FromConfig(cfg, name)
		if err != nil {
			return nil, err
		}
		p.aggs[name] = d
	}
	p.m = newMetrics(opts.Registerer)
	return p, nil
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Report is what a run removed, or with DryRun would remove.
type Report struct {
	At     time.Time
	DryRun bool
	// Tables lists, in a fixed order, every table the run removed rows or
	// partitions from (or would have).
	Tables []Table
	// Sources is the raw table of each Kafka, poll and CDC source.
	Sources []Source
	// Archived counts, per aggregate, the partitions archived because
	// raw rows they were built from were dropped.
	Archived map[string]int64
}

// Table is what a run removed from one table.
type Table struct {
	Name       string
	Rows       int64
	Partitions int
	Bytes      int64
}

// Source is the outcome for one source's raw table.
type Source struct {
	Name    string
	Dropped []Partition
	// Kept says why the oldest raw partition past the source's retention
	// stays; empty when none does.
	Kept string
	// RetainedFrom is the source's retention bound after the run (zero
	// while nothing has been dropped).
	RetainedFrom time.Time
}

// Partition is one raw partition dropped (or to drop).
type Partition struct {
	Name       string
	Start, End time.Time
	Rows       int64
	Bytes      int64
}

// ErrBusy means another process is pruning the same warehouse.
var ErrBusy = errors.New("another tidemark process is pruning")

const (
	lockPruneSQL   = `SELECT pg_try_advisory_lock(hashtextextended('tidemark.prune', 0))`
	unlockPruneSQL = `SELECT pg_advisory_unlock(hashtextextended('tidemark.prune', 0))`
)

// Run prunes once: the raw partitions of each source, then state rows. With
// dryRun it only measures what it would remove. A run that finds another
// process pruning returns ErrBusy.
func (p *Pruner) Run(ctx context.Context, dryRun bool) (*Report, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, lockPruneSQL).Scan(&got); err != nil {
		return nil, fmt.Errorf("prune: lock: %w", err)
	}
	if !got {
		p.m.runs.WithLabelValues("busy").Inc()
		return nil, ErrBusy
	}
	defer func() {
		cctx, cancel := pgconnect.Cleanup(ctx)
		defer cancel()
		if _, err := conn.Exec(cctx, unlockPruneSQL); err != nil {
			pgconnect.Close(ctx, conn.Conn())
		}
	}()
	rep, err := p.run(ctx, conn.Conn(), dryRun)
	result := "ok"
	if err != nil {
		result = "error"
	}
	p.m.runs.WithLabelValues(result).Inc()
	if err == nil && !dryRun {
		p.m.lastSuccess.Set(float64(rep.At.Unix()))
	}
	return rep, err
}

func (p *Pruner) run(ctx context.Context, conn *pgx.Conn, dryRun bool) (*Report, error) {
	now := p.now()
	v, err := p.view(ctx, conn)
	if err != nil {
		return nil, err
	}
	rep := &Report{At: now, DryRun: dryRun, Archived: map[string]int64{}}
	tables := map[string]*Table{}
	var order []string
	table := func(name string) *Table {
		if tables[name] == nil {
			tables[name] = &Table{Name: name}
			order = append(order, name)
		}
		return tables[name]
	}
	for _, name := range p.cfg.SourceNames() {
		src := p.cfg.Sources[name]
		if src.Kind() == config.KindTable {
			continue
		}
		s, err := p.pruneRaw(ctx, conn, v, src, now, dryRun, rep.Archived)
		if err != nil {
			return rep, err
		}
		rep.Sources = append(rep.Sources, s)
		t := table("raw." + name)
		for _, d := range s.Dropped {
			t.Rows += d.Rows
			t.Bytes += d.Bytes
			t.Partitions++
		}
	}
	rules, err := p.rules(ctx, conn, v, now)
	if err != nil {
		return rep, err
	}
	perRow := map[string]float64{}
	for _, r := range rules {
		if _, ok := perRow[r.table]; !ok {
			var b float64
			if err := conn.QueryRow(ctx, fmt.Sprintf(rowBytesSQL, r.table), r.table).Scan(&b); err != nil {
				return rep, fmt.Errorf("prune %s: size: %w", r.table, err)
			}
			perRow[r.table] = b
		}
		rows, err := p.apply(ctx, conn, r, dryRun)
		if err != nil {
			return rep, fmt.Errorf("prune %s: %w", r.table, err)
		}
		bytes := int64(float64(rows) * perRow[r.table])
		t := table(r.table)
		t.Rows += rows
		t.Bytes += bytes
		if !dryRun {
			p.m.rows.WithLabelValues(r.table).Add(float64(rows))
			p.m.bytes.WithLabelValues(r.table).Add(float64(bytes))
		}
	}
	for _, name := range order {
		rep.Tables = append(rep.Tables, *tables[name])
	}
	if !dryRun {
		// Make the space of the deleted rows reusable now, rather than
		// when autovacuum next reaches the table.
		for _, name := range order {
			if t := tables[name]; t.Rows > 0 && t.Partitions == 0 {
				if _, err := conn.Exec(ctx, "VACUUM (INDEX_CLEANUP ON, ANALYZE) "+name); err != nil {
					return rep, fmt.Errorf("prune: vacuum %s: %w", name, err)
				}
			}
		}
	}
	return rep, nil
}

// rule selects the rows of one table that retention removes: where is a
// condition on the table aliased t, with args.
type rule struct {
	table string
	where string
	args  []any
}

// batchRows is how many rows one delete transaction removes.
const batchRows = 5000

// apply deletes the rows of r in batches (or, with dryRun, counts them)
// and returns how many there were.
func (p *Pruner) apply(ctx context.Context, conn *pgx.Conn, r rule, dryRun bool) (int64, error) {
	var rows int64
	if dryRun {
		err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s t WHERE %s`, r.table, r.where), r.args...).Scan(&rows)
		return rows, err
	}
	sql := fmt.Sprintf(`
WITH d AS (
    DELETE FROM %[1]s t
    WHERE t.ctid = ANY(ARRAY(SELECT t.ctid FROM %[1]s t WHERE %[2]s LIMIT %[3]d)) AND %[2]s
    RETURNING 1
)
SELECT count(*) FROM d`, r.table, r.where, batchRows)
	for {
		var n int64
		if err := conn.QueryRow(ctx, sql, r.args...).Scan(&n); err != nil {
			return rows, err
		}
		rows += n
		if n < batchRows {
			return rows, nil
		}
	}
}

// rowBytesSQL estimates the bytes a row of a table takes, with its share
// of the indexes: the table's size over its rows (as the last vacuum or
// analyze counted them, or counted now when neither has run).
const rowBytesSQL = `
SELECT pg_total_relation_size(c.oid)::float8 / greatest(CASE WHEN c.reltuples > 0 THEN c.reltuples ELSE (SELECT count(*) FROM %s) END, 1)
FROM pg_class c WHERE c.oid = $1::text::regclass`

// maxXID is the largest xid8: every load is below it.
const maxXID = "18446744073709551615"

const (
	ledgerWhere      = `t.source = $1 AND t.ingested_at < $2 AND t.load_xid < $3::text::xid8`
	deadLetterWhere  = `t.source = $1 AND t.ingested_at < $2`
	correctionsWhere = `t.aggregate = $1 AND t.recorded_at < $2 AND (t.policy <> 'arrival' OR t.arrival_partition_start < $3)`
	arrivalsWhere    = `t.aggregate = $1 AND t.partition_start < $2`
	eventIDsWhere    = `t.source = $1 AND t.loaded_at < $2`
	// Ids of sources this configuration does not dedupe by id (another
	// instance's, or one whose dedupe was turned off).
	otherEventIDsWhere = `t.source <> ALL($1::text[]) AND t.loaded_at < $2`

	// Finished runs older than the cutoff, except the latest of each kind.
	backfillRunsWhere = `t.status <> 'running' AND t.finished_at < $1
  AND t.id < (SELECT max(l.id) FROM tidemark.backfill_runs l WHERE l.aggregate = t.aggregate AND l.kind = t.kind)`
	backfillChunksWhere = `t.run_id IN (SELECT t.id FROM tidemark.backfill_runs t WHERE ` + backfillRunsWhere + `)`
	// Shadow builds go with the run records, by age: publishing a
	// partition whose build is gone is refused (build it again).
	shadowBuildsWhere = `t.built_at < $1`
	verifyRunsWhere   = `t.finished_at < $1
  AND t.id < (SELECT max(l.id) FROM tidemark.verify_runs l WHERE l.aggregate = t.aggregate)`
	keyRunsWhere = `t.finished_at < $1
  AND t.id < (SELECT max(l.id) FROM tidemark.key_reconciliations l WHERE l.source = t.source)
  AND t.id <> coalesce((SELECT max(l.id) FROM tidemark.key_reconciliations l WHERE l.source = t.source AND NOT l.dry_run), 0)`

	// loadWatermarkSQL is how far an aggregate has read the ledger; no row
	// means it has never run.
	loadWatermarkSQL = `SELECT load_xid::text FROM tidemark.load_watermarks WHERE aggregate = $1`

	// latestFinalSQL is the oldest of the latest $2 final (or archived)
	// partitions of an aggregate: the completeness estimate learns from
	// their arrival histories.
	latestFinalSQL = `
SELECT min(partition_start) FROM (
    SELECT partition_start FROM tidemark.partitions
    WHERE aggregate = $1 AND state IN ('final', 'archived')
    ORDER BY partition_start DESC LIMIT $2
) l`
)

// rules lists what this run removes from the state tables.
func (p *Pruner) rules(ctx context.Context, conn *pgx.Conn, v view, now time.Time) ([]rule, error) {
	ret := p.cfg.Retention
	var ledger, dead, corrections, arrivals, ids []rule
	deduped := []string{}
	for _, name := range p.cfg.SourceNames() {
		src := p.cfg.Sources[name]
		if src.Kind() == config.KindTable {
			continue
		}
		if w := src.DedupeWindow(); w > 0 {
			deduped = append(deduped, name)
			ids = append(ids, rule{"tidemark.event_ids", eventIDsWhere, []any{name, now.Add(-w)}})
		}
		below, err := p.readBy(ctx, conn, v, name)
		if err != nil {
			return nil, err
		}
		ledger = append(ledger, rule{"tidemark.ingest_ledger", ledgerWhere, []any{name, now.Add(-ret.Ledger.Duration()), below}})
		dead = append(dead, rule{"tidemark.dead_letters", deadLetterWhere, []any{name, now.Add(-src.Retention.DeadLetters.Duration())}})
	}
	var sources []string
	for source := range v.bySource {
		sources = append(sources, source)
	}
	sort.Strings(sources)
	for _, source := range sources {
		from, err := aggregate.RetainedFrom(ctx, conn, source)
		if err != nil {
			return nil, err
		}
		bound := any("-infinity")
		if !from.IsZero() {
			bound = from
		}
		for _, d := range v.bySource[source] {
			corrections = append(corrections, rule{"tidemark.corrections", correctionsWhere, []any{d.Name, now.Add(-ret.Corrections.Duration()), bound}})
			if d.Calendar.Loc == nil {
				continue
			}
			cut := d.Calendar.Of(now.Add(-ret.Arrivals.Duration())).Start
			var oldest *time.Time
			if err := conn.QueryRow(ctx, latestFinalSQL, d.Name, lateness.HistoryPartitions(d.Calendar.By)).Scan(&oldest); err != nil {
				return nil, fmt.Errorf("prune: arrival history of %s: %w", d.Name, err)
			}
			if oldest != nil && oldest.Before(cut) {
				cut = *oldest
			}
			arrivals = append(arrivals, rule{"tidemark.partition_arrivals", arrivalsWhere, []any{d.Name, cut}})
		}
	}
	runs := now.Add(-ret.Runs.Duration())
	ids = append(ids, rule{"tidemark.event_ids", otherEventIDsWhere, []any{deduped, now.Add(-config.MaxDedupeWindow)}})
	out := append(append(append(append(ledger, dead...), ids...), corrections...), arrivals...)
	return append(out,
		rule{"tidemark.backfill_chunks", backfillChunksWhere, []any{runs}},
		rule{"tidemark.backfill_runs", backfillRunsWhere, []any{runs}},
		rule{"tidemark.shadow_builds", shadowBuildsWhere, []any{runs}},
		rule{"tidemark.verify_runs", verifyRunsWhere, []any{runs}},
		rule{"tidemark.key_reconciliations", keyRunsWhere, []any{runs}},
	), nil
}

// readBy is the transaction id below which every aggregate of source, in
// the configuration or registered, has read the ledger: the smallest of
// their load watermarks ("0" while one of them has never run), or every id
// when the source has no aggregate.
func (p *Pruner) readBy(ctx context.Context, q aggregate.Row, v view, source string) (string, error) {
	below := maxXID
	for _, d := range v.bySource[source] {
		var xid string
		err := q.QueryRow(ctx, loadWatermarkSQL, d.Name).Scan(&xid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return "0", nil
		case err != nil:
			return "", fmt.Errorf("prune: load watermark of %s: %w", d.Name, err)
		}
		if lessXID(xid, below) {
			below = xid
		}
	}
	return below, nil
}

// lessXID compares two xid8 values written in decimal.
func lessXID(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// sortPartitions orders raw partitions by start.
func sortPartitions(ps []Partition) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].Start.Before(ps[j].Start) })
}

// runTimeout bounds one run inside `tidemark run`; what a run did not reach
// is removed by the next one.
const runTimeout = 10 * time.Minute

// Loop prunes at once and then every retention.every, measured from the
// start of each run, until ctx ends; each run within runTimeout. A failed
// run is logged by the Job (retention run failed; trying again) and tried
// again at the next interval; while another process prunes, this one
// stands by.
func (p *Pruner) Loop(ctx context.Context) error {
	job := periodic.Job{Name: "retention run", Every: p.cfg.Retention.Every.Duration(), FromStart: true, Timeout: runTimeout, Log: p.log,
		Run: func(rctx context.Context) error {
			rep, err := p.Run(rctx, false)
			switch {
			case errors.Is(err, ErrBusy):
				p.log.Debug("another process is pruning; standing by")
				return nil
			case err != nil:
				return err // the Job logs it, and runs again at the next interval
			}
			p.logReport(rep)
			return nil
		}}
	return job.Loop(ctx)
}

// logReport logs what a run removed, and raw partitions kept past their
// retention.
func (p *Pruner) logReport(rep *Report) {
	for _, t := range rep.Tables {
		if t.Rows > 0 || t.Partitions > 0 {
			p.log.Info("pruned", "table", t.Name, "rows", t.Rows, "partitions", t.Partitions, "bytes", t.Bytes)
		}
	}
	for _, s := range rep.Sources {
		if s.Kept != "" {
			p.log.Info("raw partition past its retention kept", "source", s.Name, "reason", s.Kept)
		}
	}
}
