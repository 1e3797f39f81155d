package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// Defaults of KeyOptions.
const (
	DefaultKeyRanges   = 64
	DefaultKeyFanout   = 16
	DefaultKeyLeafKeys = 1000
)

// MaxReportedKeys bounds KeyReport.MissingAtSource; Deleted counts them all.
const MaxReportedKeys = 1000

// keyBatch is the most keys sent to a database in one statement.
const keyBatch = 50_000

// keyApp is the application_name of the source connection.
const keyApp = "tidemark-keys"

// KeyOptions customise a KeyReconciler.
type KeyOptions struct {
	// Logger receives progress and findings; nil discards them.
	Logger *slog.Logger
	// Registerer receives the tidemark_key_reconcile_* series; nil means
	// no metrics. Several KeyReconcilers may share one.
	Registerer prometheus.Registerer
	// Now is the service clock: it stamps flagged rows and the history
	// row. Default time.Now.
	Now func() time.Time
	// Ranges is the number of key ranges compared first (default 64);
	// Fanout the number of sub-ranges a differing range is split into
	// (default 16, at least 2); LeafKeys the most mirror keys of a range
	// whose keys are listed rather than split further (default 1000).
	Ranges, Fanout, LeafKeys int
	// MaxDelete is the largest share of the mirror's live keys (rounded
	// up to whole keys, see config.Percent.Of) whose rows one run may flag
	// or remove: mirror.key_reconcile_max_delete. A run that finds more
	// missing at the source applies nothing, is recorded as refused and
	// returns an error wrapping ErrKeyRefused; RunForced ignores the
	// limit. nil means no limit.
	MaxDelete *config.Percent
	// Progress shows a run's progress through Logger or as a bar, in
	// first-level key ranges resolved (compared, and the differing ones
	// split or listed); nil shows nothing.
	Progress *progress.Display
}

// KeyReconciler finds the rows of a mirror whose key no longer exists at
// the source (hard deletes the poller cannot see) and flags them (soft
// mode: the mirror's deleted column is set) or removes them (hard mode).
//
// A run compares key ranges by checksum (key count and the sum of the
// 64-bit hashes of the key texts) on both sides and descends only into
// ranges that differ. The ranges are quantiles of the mirror's keys: the
// first level has about Ranges of them, the first open below and the last
// open above, so source keys beyond the mirror's are covered too (their
// bounds come from a block sample of a large mirror, else from exact
// quantiles). A differing range with more than LeafKeys mirror keys is
// split into Fanout sub-ranges by exact quantiles; one with at most
// LeafKeys has its mirror keys listed and looked up at the source by key.
// Keys at the source but not in the mirror are only counted (rows not
// loaded yet): a range's source count less the mirror keys found there.
// They are never listed or acted on, so an empty or lagging mirror costs
// no more than a matching one.
//
// Text key columns are compared bytewise (COLLATE "C") on both sides, so
// the two databases put every key in the same range whatever their
// collations. Where a column's own collation already is bytewise and a
// btree index leads with the key columns, each range is an index range
// scan; otherwise a level's ranges are summed in one sorting pass over
// their union. In soft mode rows already flagged are left out, so a run
// costs in proportion to new drift.
//
// Each side is read in one REPEATABLE READ snapshot, the warehouse's under
// SessionParams. The keys found are looked up again at the source
// just before they are applied, in one warehouse transaction that holds
// the source's row of tidemark.poll_watermarks, so applying cannot
// interleave with a poll run of the same source. Every run, dry runs
// included, is recorded in tidemark.key_reconciliations.
//
// With KeyOptions.MaxDelete, a run that finds more mirror rows missing at
// the source than the limit allows (a source table emptied by mistake)
// applies nothing. When the first level's key counts alone show that many
// missing (the source has fewer keys than the mirror in those ranges), the
// run stops there, without listing keys: refusing a truncated table costs
// as little as comparing an unchanged one.
type KeyReconciler struct {
	t         *Table
	dsn       string
	pool      *pgxpool.Pool
	log       *slog.Logger
	now       func() time.Time
	m         *keyMetrics
	maxDelete *config.Percent
	progress  *progress.Display

	ranges, fanout, leafKeys int

	mu sync.Mutex // one run at a time; Run may fill t.Columns
}

// KeyReport is the outcome of one key reconciliation run.
type KeyReport struct {
	// Source is the tidemark source, Mirror the mirror table.
	Source, Mirror string
	// DryRun is true when nothing was applied; Hard when rows deleted at
	// the source are removed rather than flagged.
	DryRun, Hard bool
	// SourceKeys and MirrorKeys are the keys compared on each side (the
	// mirror's live keys in soft mode).
	SourceKeys, MirrorKeys int64
	// RangesCompared counts the ranges whose checksums were compared.
	RangesCompared int64
	// KeysTransferred counts the keys read from either database: range
	// boundaries, the keys of small differing ranges and lookup results.
	KeysTransferred int64
	// MissingAtSource lists the texts (KeyText) of the mirror keys
	// the source no longer has, in key order, at most MaxReportedKeys.
	MissingAtSource []string
	// Deleted counts the keys missing at the source after the re-check
	// just before applying: all of them, not just those listed.
	Deleted int64
	// MissingInMirror counts source keys the mirror lacks (or has flagged
	// as deleted): rows not loaded yet. They are never acted on.
	MissingInMirror int64
	// Applied counts the mirror rows flagged or removed; 0 for a dry run.
	Applied int64
	// MaxDelete is the run's limit (KeyOptions.MaxDelete; nil: none) and
	// Allowed the most mirror rows it lets one run flag or remove: that
	// share of MirrorKeys, rounded up.
	MaxDelete *config.Percent
	Allowed   int64
	// Refused is true when more keys were missing at the source than
	// Allowed, so the run applied nothing (a dry run: a run would apply
	// nothing). Forced is true for a run of RunForced, which ignores the
	// limit.
	Refused, Forced bool
	// DeletedAtLeast is true when the run was refused on the first
	// level's key counts, without listing keys: Deleted and
	// MissingInMirror are then lower bounds, and MissingAtSource is empty.
	DeletedAtLeast bool
}

// NewKeyReconciler checks the options and returns a reconciler for the
// mirror t of the source database at sourceDSN, whose warehouse is pool.
func NewKeyReconciler(t *Table, sourceDSN string, pool *pgxpool.Pool, opts KeyOptions) (*KeyReconciler, error) {
	switch {
	case t == nil:
		return nil, errors.New("keys: no mirror table")
	case t.Name == "":
		return nil, errors.New("keys: the mirror table has no source name")
	case len(t.Source) == 0 || len(t.Target) == 0:
		return nil, fmt.Errorf("keys %s: source and mirror tables are required", t.Name)
	case len(t.Key) == 0:
		return nil, fmt.Errorf("keys %s: the mirror has no key", t.Name)
	case !t.Hard && t.DeletedColumn == "":
		return nil, fmt.Errorf("keys %s: soft deletes need the mirror's deleted column", t.Name)
	case pool == nil:
		return nil, fmt.Errorf("keys %s: no warehouse pool", t.Name)
	case opts.Ranges < 0 || opts.LeafKeys < 0 || opts.Fanout < 0 || opts.Fanout == 1:
		return nil, fmt.Errorf("keys %s: ranges (%d) and leaf keys (%d) must not be negative, and fanout (%d) must be 0 (default) or at least 2",
			t.Name, opts.Ranges, opts.LeafKeys, opts.Fanout)
	case opts.MaxDelete != nil && (*opts.MaxDelete < 0 || *opts.MaxDelete > 100*config.PercentUnit):
		return nil, fmt.Errorf("keys %s: the delete limit (%s) must be between 0%% and 100%%", t.Name, *opts.MaxDelete)
	}
	if _, err := pgx.ParseConfig(sourceDSN); err != nil {
		return nil, fmt.Errorf("keys %s: source dsn: %w", t.Name, err)
	}
	k := &KeyReconciler{t: t, dsn: sourceDSN, pool: pool, log: opts.Logger, now: opts.Now, progress: opts.Progress,
		ranges: opts.Ranges, fanout: opts.Fanout, leafKeys: opts.LeafKeys}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	k.log = k.log.With("component", "keys", "source", t.Name)
	if k.now == nil {
		k.now = time.Now
	}
	if k.ranges == 0 {
		k.ranges = DefaultKeyRanges
	}
	if k.fanout == 0 {
		k.fanout = DefaultKeyFanout
	}
	if k.leafKeys == 0 {
		k.leafKeys = DefaultKeyLeafKeys
	}
	if opts.MaxDelete != nil {
		limit := *opts.MaxDelete
		k.maxDelete = &limit
	}
	k.m = newKeyMetrics(opts.Registerer, t.Name)
	return k, nil
}

// Run compares the source's keys with the mirror's once and, unless
// dryRun, flags or removes the mirror rows whose key the source no longer
// has. It calls t.Describe on the source itself if t.Columns is empty
// (describe a table shared with a poller before either runs). The mirror
// must exist. Runs of one KeyReconciler are serialised.
//
// A run that finds more keys missing at the source than
// KeyOptions.MaxDelete allows applies nothing, records the run as refused
// and returns its report with an error wrapping ErrKeyRefused; a dry run
// reports the same (Refused) without an error.
func (k *KeyReconciler) Run(ctx context.Context, dryRun bool) (KeyReport, error) {
	return k.runLogged(ctx, dryRun, false)
}

// RunForced is Run without the limit of KeyOptions.MaxDelete: it flags or
// removes every mirror row whose key the source no longer has, however
// many (unless dryRun, which reports them all). The run is recorded as
// forced. It is what `tidemark keys --force` does, once, after an
// operator has checked that the source really lost those rows.
func (k *KeyReconciler) RunForced(ctx context.Context, dryRun bool) (KeyReport, error) {
	return k.runLogged(ctx, dryRun, true)
}

func (k *KeyReconciler) runLogged(ctx context.Context, dryRun, force bool) (KeyReport, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	start := time.Now()
	rep, err := k.run(ctx, dryRun, force)
	k.m.observe(rep, err, k.now())
	if errors.Is(err, ErrKeyRefused) {
		k.logRefused(rep)
		return rep, err
	}
	if err != nil {
		k.log.Error("key reconciliation failed", "err", err)
		return rep, err
	}
	args := []any{"dry_run", dryRun, "hard", rep.Hard,
		"source_keys", rep.SourceKeys, "mirror_keys", rep.MirrorKeys, "ranges_compared", rep.RangesCompared,
		"keys_transferred", rep.KeysTransferred, "missing_at_source", rep.Deleted,
		"missing_in_mirror", rep.MissingInMirror, "applied", rep.Applied, "elapsed", time.Since(start)}
	if rep.Refused {
		args = append(args, "would_refuse", true, "max_delete", rep.MaxDelete.String(), "allowed", rep.Allowed)
	}
	if rep.Forced {
		args = append(args, "forced", true)
	}
	k.log.Info("key reconciliation done", args...)
	if rep.Forced && !rep.DryRun && rep.OverLimit() {
		k.log.Warn("key reconciliation forced beyond mirror.key_reconcile_max_delete",
			"applied", rep.Applied, "mirror_keys", rep.MirrorKeys, "share", rep.Share(),
			"max_delete", rep.MaxDelete.String(), "allowed", rep.Allowed)
	}
	return rep, nil
}

func (k *KeyReconciler) run(ctx context.Context, dryRun, force bool) (KeyReport, error) {
	t := k.t
	started := k.now()
	rep := KeyReport{Source: t.Name, Mirror: strings.Join(t.Target, "."), DryRun: dryRun, Hard: t.Hard, Forced: force}
	if k.maxDelete != nil {
		limit := *k.maxDelete
		rep.MaxDelete = &limit
	}
	src, err := Connect(ctx, k.dsn, keyApp)
	if err != nil {
		return rep, fmt.Errorf("keys %s: %w", t.Name, err)
	}
	defer pgconnect.Close(ctx, src)
	if len(t.Columns) == 0 {
		if err := t.Describe(ctx, src); err != nil {
			return rep, fmt.Errorf("keys %s: %w", t.Name, err)
		}
	}
	r := &keyRun{k: k, rep: &rep}
	if err := r.compare(ctx, src); err != nil {
		return rep, fmt.Errorf("keys %s: compare: %w", t.Name, err)
	}
	if err := r.finish(ctx, src, started); err != nil {
		return rep, fmt.Errorf("keys %s: apply: %w", t.Name, err)
	}
	if rep.Refused && !rep.DryRun {
		return rep, refusedError(rep)
	}
	return rep, nil
}

// keyRange is a range [lo, hi) of keys in bytewise key order, with the
// mirror's count and checksum of it. A nil bound is open.
type keyRange struct {
	lo, hi []string // one text per key column
	count  int64
	sum    string
}

// keySum is one side's count and checksum of a range.
type keySum struct {
	count int64
	sum   string
}

// keyFound is a mirror key missing at the source.
type keyFound struct {
	text string   // KeyText
	cols []string // each key column as text
}

// keyRun is the state of one run.
type keyRun struct {
	k     *KeyReconciler
	rep   *KeyReport
	src   pgx.Tx // source snapshot
	wh    pgx.Tx // warehouse snapshot
	ss    *keySide
	ms    *keySide
	found []keyFound
	// early is true when the run was refused on the first level's counts:
	// no keys were listed.
	early bool
	// progress counts the first level's ranges resolved.
	progress *progress.Tracker
}

// compare walks the ranges in key order inside one snapshot per database
// and collects the mirror keys missing at the source.
func (r *keyRun) compare(ctx context.Context, src *pgx.Conn) error {
	k, t := r.k, r.k.t
	snapshot := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	stx, err := src.BeginTx(ctx, snapshot)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	defer pgconnect.Rollback(ctx, stx)
	wtx, err := k.pool.BeginTx(ctx, snapshot)
	if err != nil {
		return fmt.Errorf("warehouse: %w", err)
	}
	defer pgconnect.Rollback(ctx, wtx)
	if err := SetLocal(ctx, wtx); err != nil {
		return err
	}
	r.src, r.wh = stx, wtx

	types := make([]string, len(t.Key))
	for i, name := range t.Key {
		c, ok := t.Column(name)
		if !ok {
			return fmt.Errorf("key column %s is not a column of %s", name, t.Source.Sanitize())
		}
		types[i] = c.Type
	}
	if r.ss, err = newKeySide(ctx, stx, t.Source, t.Key, types, "true"); err != nil {
		return fmt.Errorf("source %s: %w", t.Source.Sanitize(), err)
	}
	live := "true"
	if !t.Hard {
		live = "m." + pgquote.Ident(t.DeletedColumn) + " IS NULL"
	}
	if r.ms, err = newKeySide(ctx, wtx, t.Target, t.Key, types, live); err != nil {
		return fmt.Errorf("mirror %s: %w", t.Target.Sanitize(), err)
	}
	if !r.ss.indexable {
		k.log.Debug("the source's key index cannot serve bytewise ranges; ranges are counted by sorting",
			"table", t.Source.Sanitize())
	}

	// Progress counts the first level's ranges as they are resolved; the
	// first level's own sums, one pass over each side, come before any.
	r.progress = k.progress.Start(k.log, progress.Job{Label: "keys", Unit: "ranges", Total: int64(k.ranges)})
	defer r.progress.Finish(false)
	top, sums, err := r.firstLevel(ctx)
	if err != nil {
		return err
	}
	r.progress.SetTotal(int64(len(top)))
	if r.refuseEarly(top, sums) {
		k.log.Debug("the first level's key counts exceed the delete limit; keys are not listed",
			"missing_at_source_at_least", r.rep.Deleted, "allowed", r.rep.Allowed)
	} else if err := r.resolve(ctx, top, sums, 1); err != nil {
		return err
	}
	if err := stx.Commit(ctx); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	return wtx.Commit(ctx)
}

// firstLevel returns the first level's ranges, with the mirror's counts
// and checksums, and the source's. The bounds of a large mirror come from
// a block sample, after which both sides are summed at once; otherwise
// they are exact quantiles.
func (r *keyRun) firstLevel(ctx context.Context) ([]keyRange, []keySum, error) {
	bounds, err := r.sampleBounds(ctx)
	if err != nil {
		return nil, nil, err
	}
	if len(bounds) > 0 {
		ranges := make([]keyRange, len(bounds)+1)
		for i, b := range bounds {
			ranges[i].hi = b
			ranges[i+1].lo = b
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var mirrorSums []keySum
		var mirrorErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			if mirrorSums, mirrorErr = r.checksums(cctx, r.wh, r.ms, ranges); mirrorErr != nil {
				cancel()
			}
		}()
		sourceSums, sourceErr := r.checksums(cctx, r.src, r.ss, ranges)
		if sourceErr != nil {
			cancel()
		}
		<-done
		if err := errors.Join(mirrorErr, sourceErr); err != nil {
			return nil, nil, err
		}
		for i := range ranges {
			ranges[i].count, ranges[i].sum = mirrorSums[i].count, mirrorSums[i].sum
		}
		r.k.log.Debug("first level", "ranges", len(ranges), "bounds", "sampled")
		return ranges, sourceSums, nil
	}

	var total int64
	sql, args := r.ms.count(keyRange{})
	if err := r.wh.QueryRow(ctx, sql, args...).Scan(&total); err != nil {
		return nil, nil, fmt.Errorf("count the mirror's keys: %w", err)
	}
	ranges := []keyRange{{sum: "0"}}
	if total > 0 {
		if ranges, err = r.tiles(ctx, keyRange{count: total}, ceilDiv(total, int64(r.k.ranges))); err != nil {
			return nil, nil, err
		}
	}
	r.k.log.Debug("first level", "ranges", len(ranges), "bounds", "exact")
	sums, err := r.checksums(ctx, r.src, r.ss, ranges)
	return ranges, sums, err
}

// Sampling sizes: the first level's bounds are taken from about
// keySamplePerRange sampled keys per range, when the mirror is estimated
// to have keySampleFactor times as many keys as that.
const (
	keySamplePerRange = 200
	keySampleFactor   = 20
)

// sampleBounds returns the first level's inner bounds from a block sample
// of a large mirror whose key index serves its ranges; nil otherwise.
func (r *keyRun) sampleBounds(ctx context.Context) ([][]string, error) {
	if !r.ms.indexable || r.k.ranges < 2 {
		return nil, nil
	}
	var estimate int64
	if err := r.wh.QueryRow(ctx, keyEstimateSQL, r.ms.table).Scan(&estimate); err != nil {
		return nil, fmt.Errorf("estimate the mirror's size: %w", err)
	}
	target := int64(r.k.ranges) * keySamplePerRange
	if estimate < keySampleFactor*target {
		return nil, nil
	}
	percent := float32(100 * float64(target) / float64(estimate))
	sql, args := r.ms.sample(percent, r.k.ranges)
	rows, err := r.wh.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("sample the mirror's keys: %w", err)
	}
	n := len(r.ms.names)
	bounds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]string, error) {
		b := make([]string, n)
		dest := make([]any, n)
		for i := range b {
			dest[i] = &b[i]
		}
		return b, row.Scan(dest...)
	})
	if err != nil {
		return nil, fmt.Errorf("sample the mirror's keys: %w", err)
	}
	r.rep.KeysTransferred += int64(len(bounds))
	return bounds, nil
}

// descend compares adjacent ranges, in key order, whose mirror sums are
// known.
func (r *keyRun) descend(ctx context.Context, ranges []keyRange, level int) error {
	sums, err := r.checksums(ctx, r.src, r.ss, ranges)
	if err != nil {
		return err
	}
	return r.resolve(ctx, ranges, sums, level)
}

// resolve compares the ranges' sums on both sides and resolves the ranges
// that differ: by splitting them, or by listing their mirror keys.
func (r *keyRun) resolve(ctx context.Context, ranges []keyRange, sourceSums []keySum, level int) error {
	differ := 0
	for i, rg := range ranges {
		if level == 1 && i > 0 {
			// The first level's range before this one is resolved.
			r.progress.Add(1)
		}
		r.rep.RangesCompared++
		sc := sourceSums[i]
		if level == 1 {
			r.rep.SourceKeys += sc.count
			r.rep.MirrorKeys += rg.count
		}
		if sc.count == rg.count && sc.sum == rg.sum {
			continue
		}
		differ++
		if rg.count > int64(r.k.leafKeys) {
			sub, err := r.tiles(ctx, rg, ceilDiv(rg.count, int64(r.k.fanout)))
			if err != nil {
				return err
			}
			if err := r.descend(ctx, sub, level+1); err != nil {
				return err
			}
			continue
		}
		if err := r.leaf(ctx, rg, sc.count); err != nil {
			return err
		}
	}
	if level == 1 && len(ranges) > 0 {
		r.progress.Add(1)
	}
	r.k.log.Debug("key ranges compared", "level", level, "ranges", len(ranges), "differ", differ)
	return nil
}

// checksums computes one side's count and checksum of each of the
// adjacent ranges: a range query each, in one round trip, where the key's
// index serves them; else one sorting pass over the ranges' union.
func (r *keyRun) checksums(ctx context.Context, tx pgx.Tx, side *keySide, ranges []keyRange) ([]keySum, error) {
	out := make([]keySum, len(ranges))
	if !side.indexable {
		sql, args := side.buckets(ranges)
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("checksums of %s: %w", side.table, err)
		}
		for i := range out {
			out[i].sum = "0"
		}
		var bucket, count int64
		var sum string
		_, err = pgx.ForEachRow(rows, []any{&bucket, &count, &sum}, func() error {
			if bucket < 0 || bucket >= int64(len(out)) {
				return fmt.Errorf("bucket %d out of %d", bucket, len(out))
			}
			out[bucket] = keySum{count: count, sum: sum}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("checksums of %s: %w", side.table, err)
		}
		return out, nil
	}
	b := &pgx.Batch{}
	for _, rg := range ranges {
		sql, args := side.checksum(rg)
		b.Queue(sql, args...)
	}
	br := tx.SendBatch(ctx, b)
	for i := range ranges {
		if err := br.QueryRow().Scan(&out[i].count, &out[i].sum); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("checksums of %s: %w", side.table, err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("checksums of %s: %w", side.table, err)
	}
	return out, nil
}

// tiles splits a range of the mirror into adjacent sub-ranges of step
// mirror keys each (the last may have fewer), with their checksums. The
// first sub-range keeps the range's lower bound, the last its upper bound.
func (r *keyRun) tiles(ctx context.Context, parent keyRange, step int64) ([]keyRange, error) {
	sql, args := r.ms.tiles(parent, step)
	rows, err := r.wh.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("split the mirror's keys: %w", err)
	}
	n := len(r.ms.names)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (keyRange, error) {
		var rg keyRange
		first := make([]string, n)
		dest := []any{&rg.count, &rg.sum}
		for i := range first {
			dest = append(dest, &first[i])
		}
		err := row.Scan(dest...)
		rg.lo = first
		return rg, err
	})
	if err != nil {
		return nil, fmt.Errorf("split the mirror's keys: %w", err)
	}
	r.rep.KeysTransferred += int64(len(out))
	for i := range out {
		if i == 0 {
			out[i].lo = parent.lo
		}
		if i+1 < len(out) {
			out[i].hi = out[i+1].lo
		} else {
			out[i].hi = parent.hi
		}
	}
	return out, nil
}

// leaf resolves a small differing range: it lists the range's mirror keys
// and looks them up at the source. The source's keys are only counted:
// those the mirror lacks are the source's count less the mirror keys it
// has.
func (r *keyRun) leaf(ctx context.Context, rg keyRange, sourceCount int64) error {
	var keys []keyFound
	if rg.count > 0 {
		sql, args := r.ms.stream(rg)
		rows, err := r.wh.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("list the mirror's keys: %w", err)
		}
		n := len(r.ms.names)
		keys, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (keyFound, error) {
			f := keyFound{cols: make([]string, n)}
			dest := []any{&f.text}
			for i := range f.cols {
				dest = append(dest, &f.cols[i])
			}
			return f, row.Scan(dest...)
		})
		if err != nil {
			return fmt.Errorf("list the mirror's keys: %w", err)
		}
		r.rep.KeysTransferred += int64(len(keys))
	}
	absent, err := absentKeys(ctx, r.src, r.ss, keys)
	if err != nil {
		return fmt.Errorf("look the mirror's keys up at the source: %w", err)
	}
	r.rep.KeysTransferred += int64(len(absent))
	r.found = append(r.found, absent...)
	missing := sourceCount - int64(len(keys)-len(absent))
	if missing < 0 {
		// The source has fewer keys in the range than the lookups found:
		// the two sides disagree on the range, which they must not.
		r.k.log.Warn("source and mirror disagree on a key range", "range_lo", rg.lo, "range_hi", rg.hi,
			"source_keys", sourceCount, "mirror_keys_found", len(keys)-len(absent))
		missing = 0
	}
	r.rep.MissingInMirror += missing
	return nil
}

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// absentKeys returns the keys, in their order, that side's table lacks.
func absentKeys(ctx context.Context, q querier, side *keySide, keys []keyFound) ([]keyFound, error) {
	var out []keyFound
	for len(keys) > 0 {
		batch := keys[:min(len(keys), keyBatch)]
		keys = keys[len(batch):]
		args := []any{texts(batch)}
		args = append(args, columnArrays(batch, len(side.names))...)
		rows, err := q.Query(ctx, side.absent(), args...)
		if err != nil {
			return nil, err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		if len(gone) == 0 {
			continue
		}
		set := make(map[string]bool, len(gone))
		for _, g := range gone {
			set[g] = true
		}
		for _, f := range batch {
			if set[f.text] {
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// finish re-checks and applies the keys found (recheck), unless the run
// was refused on the first level's counts, and records the run either way.
func (r *keyRun) finish(ctx context.Context, src *pgx.Conn, started time.Time) error {
	k, t, rep := r.k, r.k.t, r.rep
	tx, err := k.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer pgconnect.Rollback(ctx, tx)
	if err := SetLocal(ctx, tx); err != nil {
		return err
	}
	if !r.early {
		if err := r.recheck(ctx, tx, src); err != nil {
			return err
		}
	}
	mode := config.DeletesSoft
	if t.Hard {
		mode = config.DeletesHard
	}
	if _, err := tx.Exec(ctx, keyHistorySQL, rep.Source, rep.Mirror, started, k.now(), rep.DryRun, mode,
		rep.SourceKeys, rep.MirrorKeys, rep.RangesCompared, rep.KeysTransferred, rep.Deleted,
		rep.MissingInMirror, rep.Applied, rep.Refused, rep.Forced); err != nil {
		return fmt.Errorf("record the run: %w", err)
	}
	return tx.Commit(ctx)
}

// recheck looks the keys found up again at the source and, unless the run
// is a dry run or the delete limit refuses it, flags or removes their
// mirror rows in tx.
func (r *keyRun) recheck(ctx context.Context, tx pgx.Tx, src *pgx.Conn) error {
	k, t, rep := r.k, r.k.t, r.rep
	apply := !rep.DryRun && len(r.found) > 0
	if apply {
		// Hold the poller of this source off before the re-check: a row
		// put back at the source and loaded before the lock is found at
		// the source by the re-check; one loaded after waits for the
		// commit.
		if _, err := tx.Exec(ctx, keyEnsureStateSQL, t.Name); err != nil {
			return fmt.Errorf("poll state: %w", err)
		}
		if _, err := tx.Exec(ctx, keyLockStateSQL, t.Name); err != nil {
			return fmt.Errorf("lock the poll state: %w", err)
		}
	}
	gone, err := absentKeys(ctx, src, r.ss, r.found)
	if err != nil {
		return fmt.Errorf("re-check at the source: %w", err)
	}
	rep.KeysTransferred += int64(len(gone))
	if back := len(r.found) - len(gone); back > 0 {
		k.log.Info("keys found again at the source on the re-check", "keys", back)
	}
	rep.Deleted = int64(len(gone))
	rep.MissingAtSource = texts(gone[:min(len(gone), MaxReportedKeys)])
	r.limit()
	if apply && !rep.Refused {
		deletedAt := k.now()
		for len(gone) > 0 {
			batch := gone[:min(len(gone), keyBatch)]
			gone = gone[len(batch):]
			args := columnArrays(batch, len(r.ms.names))
			if !t.Hard {
				args = append([]any{deletedAt}, args...)
			}
			tag, err := tx.Exec(ctx, r.ms.remove(t), args...)
			if err != nil {
				return err
			}
			rep.Applied += tag.RowsAffected()
		}
	}
	return nil
}

func texts(keys []keyFound) []string {
	out := make([]string, len(keys))
	for i, f := range keys {
		out[i] = f.text
	}
	return out
}

// columnArrays transposes keys into one text array per key column.
func columnArrays(keys []keyFound, n int) []any {
	out := make([]any, n)
	for c := range n {
		col := make([]string, len(keys))
		for i, f := range keys {
			col[i] = f.cols[c]
		}
		out[c] = col
	}
	return out
}

func ceilDiv(a, b int64) int64 { return max(1, (a+b-1)/b) }

// keySide builds the statements of one database, the source or the
// mirror, whose rows are aliased m.
type keySide struct {
	table    string   // quoted, qualified name
	names    []string // quoted key column names in key order
	bytewise []bool   // the column orders bytewise as it is
	types    []string // the key columns' types
	keyText  string   // KeyText of m
	live     string   // the rows compared
	// indexable is true when the key's index serves bytewise range
	// predicates: every key column orders bytewise and a btree index
	// leads with the key columns in key order.
	indexable bool
}

// newKeySide reads how the key columns of table collate and whether an
// index serves their ranges, and builds the statements of that side.
func newKeySide(ctx context.Context, tx pgx.Tx, table pgx.Identifier, key, types []string, live string) (*keySide, error) {
	rows, err := tx.Query(ctx, keyCollationSQL, table.Sanitize(), key)
	if err != nil {
		return nil, fmt.Errorf("read the key's collations: %w", err)
	}
	type keyCollation struct {
		name                 string
		collatable, bytewise bool
	}
	colls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyCollation, error) {
		var c keyCollation
		return c, r.Scan(&c.name, &c.collatable, &c.bytewise)
	})
	if err != nil {
		return nil, fmt.Errorf("read the key's collations: %w", err)
	}
	if len(colls) != len(key) {
		return nil, fmt.Errorf("the table does not exist or lacks key columns (%s)", strings.Join(key, ", "))
	}
	s := &keySide{table: table.Sanitize(), types: types, keyText: KeyText("m", key), live: live}
	if err := tx.QueryRow(ctx, keyIndexSQL, s.table, key).Scan(&s.indexable); err != nil {
		return nil, fmt.Errorf("read the key's index: %w", err)
	}
	for i, name := range key {
		s.names = append(s.names, pgquote.Ident(name))
		s.bytewise = append(s.bytewise, colls[i].bytewise)
		s.indexable = s.indexable && colls[i].bytewise
	}
	return s, nil
}

// cols returns the key columns of the rows aliased alias.
func (s *keySide) cols(alias string) []string {
	out := make([]string, len(s.names))
	for i, n := range s.names {
		out[i] = alias + "." + n
	}
	return out
}

// cmp returns the key columns of alias as compared and ordered: bytewise.
func (s *keySide) cmp(alias string) []string {
	out := s.cols(alias)
	for i := range out {
		if !s.bytewise[i] {
			out[i] += ` COLLATE "C"`
		}
	}
	return out
}

// aliased returns the key columns of m as tm_k1..n.
func (s *keySide) aliased() string {
	out := s.cols("m")
	for i := range out {
		out[i] += fmt.Sprintf(" AS tm_k%d", i+1)
	}
	return strings.Join(out, ", ")
}

// where is the predicate of a range; its bounds are parameters from $first
// on, cast from text to the key columns' types.
func (s *keySide) where(rg keyRange, first int) (string, []any) {
	parts := []string{s.live}
	var args []any
	bound := func(op string, vals []string) {
		params := make([]string, len(vals))
		for i, v := range vals {
			params[i] = fmt.Sprintf("$%d::%s", first+len(args), s.types[i])
			args = append(args, v)
		}
		parts = append(parts, row(s.cmp("m"))+" "+op+" "+row(params))
	}
	if rg.lo != nil {
		bound(">=", rg.lo)
	}
	if rg.hi != nil {
		bound("<", rg.hi)
	}
	return strings.Join(parts, " AND "), args
}

// row is a row constructor of several expressions, or the one expression.
func row(exprs []string) string {
	if len(exprs) == 1 {
		return exprs[0]
	}
	return "(" + strings.Join(exprs, ", ") + ")"
}

func (s *keySide) count(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	return fmt.Sprintf(keyCountSQL, s.table, pred), args
}

func (s *keySide) checksum(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	return fmt.Sprintf(keyChecksumSQL, s.table, pred, s.keyText), args
}

func (s *keySide) tiles(rg keyRange, step int64) (string, []any) {
	pred, args := s.where(rg, 2)
	firsts := make([]string, len(s.names))
	for i := range firsts {
		firsts[i] = fmt.Sprintf("max(CASE WHEN (q.tm_rn - 1) %% $1 = 0 THEN q.tm_k%d::text END)", i+1)
	}
	sql := fmt.Sprintf(keyTilesSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.keyText,
		s.aliased(), strings.Join(firsts, ", "))
	return sql, append([]any{step}, args...)
}

func (s *keySide) sample(percent float32, ranges int) (string, []any) {
	pred, args := s.where(keyRange{}, 3)
	texts := make([]string, len(s.names))
	for i := range texts {
		texts[i] = fmt.Sprintf("q.tm_k%d::text", i+1)
	}
	sql := fmt.Sprintf(keySampleSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.aliased(), strings.Join(texts, ", "))
	return sql, append([]any{percent, int64(ranges)}, args...)
}

// buckets computes the sums of adjacent ranges in one pass (see
// keyBucketsSQL).
func (s *keySide) buckets(ranges []keyRange) (string, []any) {
	union := keyRange{lo: ranges[0].lo, hi: ranges[len(ranges)-1].hi}
	pred, args := s.where(union, 1)
	bounds := make([]keyFound, 0, len(ranges)-1)
	for _, rg := range ranges[1:] {
		bounds = append(bounds, keyFound{cols: rg.lo})
	}
	unnest, aliases, _ := s.unnest(len(args) + 1)
	casts := make([]string, len(s.names))
	for i := range casts {
		casts[i] = fmt.Sprintf("u.tm_k%d::%s", i+1, s.types[i])
	}
	cmp := make([]string, len(s.names))
	for i := range cmp {
		cmp[i] = fmt.Sprintf("b.tm_k%d", i+1)
		if !s.bytewise[i] {
			cmp[i] += ` COLLATE "C"`
		}
	}
	sql := fmt.Sprintf(keyBucketsSQL, s.table, pred, s.keyText, s.aliased(), strings.Join(cmp, ", "),
		unnest, strings.Join(casts, ", "), aliases)
	return sql, append(args, columnArrays(bounds, len(s.names))...)
}

func (s *keySide) stream(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	cols := s.cols("m")
	for i := range cols {
		cols[i] += "::text"
	}
	return fmt.Sprintf(keyStreamSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.keyText, strings.Join(cols, ", ")), args
}

// unnest returns the arguments of unnest for one text array per key
// column from $first on, their column aliases and the match of m against
// them.
func (s *keySide) unnest(first int) (args, aliases, match string) {
	a := make([]string, len(s.names))
	al := make([]string, len(s.names))
	m := make([]string, len(s.names))
	for i, c := range s.cols("m") {
		a[i] = fmt.Sprintf("$%d::text[]", first+i)
		al[i] = fmt.Sprintf("tm_k%d", i+1)
		m[i] = fmt.Sprintf("%s = u.tm_k%d::%s", c, i+1, s.types[i])
	}
	return strings.Join(a, ", "), strings.Join(al, ", "), strings.Join(m, " AND ")
}

func (s *keySide) absent() string {
	args, aliases, match := s.unnest(2)
	return fmt.Sprintf(keyAbsentSQL, s.table, "$1::text[], "+args, aliases, match)
}

// remove flags (soft) or deletes (hard) the mirror rows of the given keys.
func (s *keySide) remove(t *Table) string {
	if t.Hard {
		args, aliases, match := s.unnest(1)
		return fmt.Sprintf(keyRemoveSQL, s.table, args, aliases, match)
	}
	args, aliases, match := s.unnest(2)
	return fmt.Sprintf(keyFlagSQL, s.table, pgquote.Ident(t.DeletedColumn), args, aliases, match)
}

// keyMetrics are the Prometheus series of key reconciliation, shared by
// the KeyReconcilers of one registerer.
type keyMetrics struct {
	source      string
	checked     *prometheus.CounterVec
	transferred *prometheus.CounterVec
	found       *prometheus.CounterVec
	runs        *prometheus.CounterVec
	refused     *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
}

func newKeyMetrics(reg prometheus.Registerer, source string) *keyMetrics {
	m := &keyMetrics{
		source: source,
		checked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_keys_checked_total",
			Help: "Keys covered by successful key reconciliation runs, source and mirror keys together.",
		}, []string{"source"}),
		transferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_keys_transferred_total",
			Help: "Keys read from the source or the warehouse by key reconciliation: range bounds, keys of small differing ranges, lookup results.",
		}, []string{"source"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_deletes_found_total",
			Help: "Mirror keys found missing at the source (after the re-check), dry runs included.",
		}, []string{"source"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_runs_total",
			Help: "Key reconciliation runs by result (ok or error).",
		}, []string{"source", "result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_refused_total",
			Help: "Key reconciliation runs that found more mirror rows missing at the source than mirror.key_reconcile_max_delete allows and applied nothing (also counted as errors).",
		}, []string{"source"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_key_reconcile_last_success_timestamp_seconds",
			Help: "Service time at which the last successful key reconciliation run finished.",
		}, []string{"source"}),
	}
	if reg != nil {
		m.checked = promreg.Shared(reg, m.checked)
		m.transferred = promreg.Shared(reg, m.transferred)
		m.found = promreg.Shared(reg, m.found)
		m.runs = promreg.Shared(reg, m.runs)
		m.refused = promreg.Shared(reg, m.refused)
		m.lastSuccess = promreg.Shared(reg, m.lastSuccess)
	}
	m.checked.WithLabelValues(source)
	m.transferred.WithLabelValues(source)
	m.found.WithLabelValues(source)
	m.runs.WithLabelValues(source, "ok")
	m.runs.WithLabelValues(source, "error")
	m.refused.WithLabelValues(source)
	return m
}

func (m *keyMetrics) observe(rep KeyReport, err error, now time.Time) {
	m.transferred.WithLabelValues(m.source).Add(float64(rep.KeysTransferred))
	if err != nil {
		m.runs.WithLabelValues(m.source, "error").Inc()
		if errors.Is(err, ErrKeyRefused) {
			m.refused.WithLabelValues(m.source).Inc()
		}
		return
	}
	m.runs.WithLabelValues(m.source, "ok").Inc()
	m.checked.WithLabelValues(m.source).Add(float64(rep.SourceKeys + rep.MirrorKeys))
	m.found.WithLabelValues(m.source).Add(float64(rep.Deleted))
	m.lastSuccess.WithLabelValues(m.source).Set(float64(now.UnixNano()) / 1e9)
}
