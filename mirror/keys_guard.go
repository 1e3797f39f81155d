package mirror

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/tidemark-dev/tidemark/config"
)

// ErrKeyRefused is wrapped by the error of a key reconciliation run that
// found more mirror rows missing at the source than its limit
// (KeyOptions.MaxDelete, mirror.key_reconcile_max_delete) allows, and so
// applied nothing. The run is recorded as refused; its report says how
// many rows were missing and how many the limit allows.
var ErrKeyRefused = errors.New("refused by mirror.key_reconcile_max_delete")

// OverLimit reports whether the run found more keys missing at the source
// than its limit allows (false without a limit).
func (r KeyReport) OverLimit() bool { return r.MaxDelete != nil && r.Deleted > r.Allowed }

// Share is Deleted as a percentage of MirrorKeys, rounded up to a
// hundredth of a percent: "100%", "33.34%".
func (r KeyReport) Share() string { return share(r.Deleted, r.MirrorKeys) }

// limit sets the report's Allowed from its mirror keys and decides whether
// the limit refuses the run.
func (r *keyRun) limit() {
	rep := r.rep
	if rep.MaxDelete == nil {
		return
	}
	rep.Allowed = rep.MaxDelete.Of(rep.MirrorKeys)
	rep.Refused = rep.OverLimit() && !rep.Forced
}

// refuseEarly refuses the run on the first level's counts when they alone
// show more mirror keys missing at the source than the limit allows: a
// range whose source count is below its mirror count misses at least the
// difference. The report then holds those lower bounds and no keys; the
// ranges are not descended into, so a source table emptied by mistake is
// refused without listing its mirror's keys.
func (r *keyRun) refuseEarly(top []keyRange, sums []keySum) bool {
	rep := r.rep
	if rep.MaxDelete == nil || rep.Forced {
		return false
	}
	var sourceKeys, mirrorKeys, missing, notLoaded int64
	for i, rg := range top {
		sc := sums[i].count
		sourceKeys += sc
		mirrorKeys += rg.count
		missing += max(0, rg.count-sc)
		notLoaded += max(0, sc-rg.count)
	}
	if missing <= rep.MaxDelete.Of(mirrorKeys) {
		return false
	}
	rep.SourceKeys, rep.MirrorKeys = sourceKeys, mirrorKeys
	rep.RangesCompared = int64(len(top))
	rep.Deleted, rep.MissingInMirror = missing, notLoaded
	rep.MissingAtSource = []string{}
	rep.DeletedAtLeast = true
	r.early = true
	r.limit()
	return true
}

// refusedError is the error of a refused run.
func refusedError(rep KeyReport) error {
	return fmt.Errorf("keys %s: %w: %s of %d mirror rows (%s) are missing at the source, more than %s (%d rows); nothing was applied",
		rep.Source, ErrKeyRefused, rep.missingText(), rep.MirrorKeys, rep.Share(), rep.MaxDelete, rep.Allowed)
}

// missingText is Deleted, marked as a lower bound where it is one.
func (r KeyReport) missingText() string {
	n := strconv.FormatInt(r.Deleted, 10)
	if r.DeletedAtLeast {
		return "at least " + n
	}
	return n
}

// logRefused logs a refused run: one error line that says what was found,
// the limit, and what to do.
func (k *KeyReconciler) logRefused(rep KeyReport) {
	k.log.Error("key reconciliation refused: more mirror rows are missing at the source than mirror.key_reconcile_max_delete allows; nothing was applied",
		"missing_at_source", rep.missingText(), "mirror_keys", rep.MirrorKeys, "share", rep.Share(),
		"max_delete", rep.MaxDelete.String(), "allowed", rep.Allowed, "hard", rep.Hard,
		"next", fmt.Sprintf("check the source table; if these rows were deleted on purpose, run `tidemark keys --source %s --force` once, or raise mirror.key_reconcile_max_delete", rep.Source))
}

// share is n as a percentage of of, rounded up to a hundredth of a
// percent.
func share(n, of int64) string {
	if n <= 0 || of <= 0 {
		return "0%"
	}
	unit := int64(100 * config.PercentUnit)
	if n > math.MaxInt64/unit {
		return config.Percent(math.Ceil(float64(n) / float64(of) * float64(unit))).String()
	}
	return config.Percent((n*unit + of - 1) / of).String()
}
