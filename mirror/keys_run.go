package mirror

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/progress"
)

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
// to have keySampleFactor times as many keys as that. The sample reads
// whole pages, at least keySampleMinPages of them (or the whole table):
// fewer would often return no keys at all from a table of narrow rows.
const (
	keySamplePerRange = 200
	keySampleFactor   = 20
	keySampleMinPages = 32
)

// samplePercent is the share of a table of estimate rows on pages pages
// to sample for about target rows, reading at least keySampleMinPages.
func samplePercent(target, estimate, pages int64) float64 {
	p := 100 * float64(target) / float64(estimate)
	if pages > 0 {
		p = max(p, 100*float64(keySampleMinPages)/float64(pages))
	}
	return min(p, 100)
}

// sampleBounds returns the first level's inner bounds from a block sample
// of a large mirror whose key index serves its ranges; nil otherwise.
func (r *keyRun) sampleBounds(ctx context.Context) ([][]string, error) {
	if !r.ms.indexable || r.k.ranges < 2 {
		return nil, nil
	}
	var estimate, pages int64
	if err := r.wh.QueryRow(ctx, keyEstimateSQL, r.ms.table).Scan(&estimate, &pages); err != nil {
		return nil, fmt.Errorf("estimate the mirror's size: %w", err)
	}
	target := int64(r.k.ranges) * keySamplePerRange
	if estimate < keySampleFactor*target {
		return nil, nil
	}
	percent := float32(samplePercent(target, estimate, pages))
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
