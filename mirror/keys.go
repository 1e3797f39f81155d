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
	"github.com/tidemark-dev/tidemark/internal/progress"
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
