package status

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/pause"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/retention"
)

// Querier reads from the warehouse.
type Querier interface {
	raw.Querier
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// pausesVersion is the schema version that made tidemark.source_pauses.
const pausesVersion = 15

// Gather builds the report. adm may be nil (no brokers configured or
// reachable); partitions then show no end offset or lag. now is the
// service clock, used for the event-time watermark's idle timeout.
func Gather(ctx context.Context, q Querier, cfg *config.Config, adm *kadm.Client, now time.Time) (*Report, error) {
	v, err := migrate.Version(ctx, q)
	if err != nil {
		return nil, err
	}
	r := &Report{GeneratedAt: now.UTC(), SchemaVersion: v}
	var st streams
	if st.parts, err = raw.PartitionStates(ctx, q, cfg.Kafka.Group); err != nil {
		return nil, err
	}
	if st.reasons, st.notReplayed, err = deadLetterReasons(ctx, q, v); err != nil {
		return nil, err
	}
	st.ends, st.starts, st.kafkaErr = listOffsets(ctx, adm, cfg)
	paused := map[string]pause.Pause{}
	if v >= pausesVersion {
		list, err := pause.List(ctx, q)
		if err != nil {
			return nil, err
		}
		for _, p := range list {
			paused[p.Source] = p
		}
	}
	for _, name := range cfg.SourceNames() {
		s, err := gatherSource(ctx, q, name, cfg.Sources[name], v, &st, now)
		if err != nil {
			return nil, err
		}
		if p, ok := paused[name]; ok {
			s.Paused = &p
		}
		r.Sources = append(r.Sources, s)
	}
	if v >= 10 {
		if r.Unconfigured, err = gatherUnconfigured(ctx, q, cfg); err != nil {
			return nil, err
		}
	}
	if v < 2 || len(cfg.Aggregates) == 0 {
		return r, nil
	}
	if err := gatherAggregates(ctx, q, cfg, r); err != nil {
		return nil, err
	}
	return r, nil
}

// streams is what Gather reads once for all sources: the stored state of
// every Kafka partition, dead letters by source and reason, and the
// brokers' offsets (nil when not asked, with kafkaErr when the brokers
// could not answer).
type streams struct {
	parts        []raw.PartitionState
	reasons      map[string]map[string]int64
	notReplayed  map[string]int64 // dead letters not replayed, by source
	ends, starts kadm.ListedOffsets
	kafkaErr     error
}

// listOffsets asks the brokers, within 5 seconds, for the end and start
// offsets of the topics of cfg's Kafka sources; nothing without adm or
// such topics.
func listOffsets(ctx context.Context, adm *kadm.Client, cfg *config.Config) (ends, starts kadm.ListedOffsets, err error) {
	var topics []string
	for _, name := range cfg.SourceNames() {
		if s := cfg.Sources[name]; s.Kind().Kafka() {
			topics = append(topics, s.Kafka.Topics...)
		}
	}
	if adm == nil || len(topics) == 0 {
		return nil, nil, nil
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ends, err = adm.ListEndOffsets(actx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err == nil {
		starts, err = adm.ListStartOffsets(actx, topics...)
	}
	if err == nil {
		err = starts.Error()
	}
	return ends, starts, err
}

// gatherSource builds the view of source name, configured as sc: its
// kind's state, its raw table, and for a Kafka source what its partitions
// stored and their lag; for the others the event-time watermark stored for
// them.
func gatherSource(ctx context.Context, q Querier, name string, sc *config.Source, v int, st *streams, now time.Time) (Source, error) {
	kind := sc.Kind()
	if kind == config.KindDebezium {
		kind = config.KindKafka // its partitions, offsets and lag are a Kafka source's
	}
	s := Source{Name: name, Kind: string(kind), DeadLettersByReason: st.reasons[name], DeadLettersNotReplayed: st.notReplayed[name]}
	if s.DeadLettersByReason == nil {
		s.DeadLettersByReason = map[string]int64{}
	}
	if sc.Kind().Kafka() {
		s.Topics = sc.Kafka.Topics
	}
	var err error
	if sc.Kind() == config.KindPoll {
		if s.Poll, err = gatherPoll(ctx, q, sc, v); err != nil {
			return s, err
		}
	}
	if sc.Kind() == config.KindCDC {
		if s.CDC, err = gatherCDC(ctx, q, sc, v, now); err != nil {
			return s, err
		}
	}
	if sc.Kind() != config.KindTable {
		if s.Raw, err = gatherRaw(ctx, q, sc, v); err != nil {
			return s, err
		}
	}
	if !sc.Kind().Kafka() {
		// Table and poll sources have no stream state; the reconciler
		// (table) or each poll run stores their watermark.
		if v >= 2 {
			var wm *time.Time
			err := q.QueryRow(ctx, "SELECT event_time_watermark FROM tidemark.source_watermarks WHERE source = $1", name).Scan(&wm)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return s, fmt.Errorf("read the watermark of source %s: %w", name, err)
			}
			s.EventTimeWatermark = utc(wm)
		}
		return s, nil
	}
	if wm, ok := raw.EventTimeWatermark(sc, st.parts, now); ok {
		wm = wm.UTC()
		s.EventTimeWatermark = &wm
	}
	if st.kafkaErr != nil {
		s.KafkaError = st.kafkaErr.Error()
	}
	kafkaPartitions(&s, st)
	return s, nil
}

// kafkaPartitions fills in the stored state of s's Kafka partitions and
// totals, and, when the brokers answered, their end offsets and lag,
// partitions with nothing stored yet included.
func kafkaPartitions(s *Source, st *streams) {
	stored := map[string]bool{}
	for _, p := range st.parts {
		if p.Source != s.Name {
			continue
		}
		s.Records += p.Records
		s.Rows += p.RowsWritten
		s.Duplicates += p.Duplicates
		s.DeadLetters += p.DeadLetters
		vp := Partition{Topic: p.Topic, Partition: p.Partition, MaxEventTime: utc(p.MaxEventTime)}
		if p.NextOffset >= 0 {
			off := p.NextOffset
			vp.StoredOffset = &off
			upd := p.UpdatedAt.UTC()
			vp.UpdatedAt = &upd
		}
		s.Partitions = append(s.Partitions, vp)
		stored[key(p.Topic, p.Partition)] = true
	}
	if st.ends != nil && st.kafkaErr == nil {
		// Partitions with nothing stored yet still appear, with their
		// whole log as lag.
		for _, t := range s.Topics {
			for part := range st.ends[t] {
				if !stored[key(t, part)] {
					s.Partitions = append(s.Partitions, Partition{Topic: t, Partition: part})
				}
			}
		}
		var total int64
		for i := range s.Partitions {
			p := &s.Partitions[i]
			lo, ok := st.ends.Lookup(p.Topic, p.Partition)
			if !ok {
				continue
			}
			end := lo.Offset
			p.EndOffset = &end
			// Nothing stored yet: the whole retained log is behind.
			var lag int64
			if p.StoredOffset != nil {
				lag = max(0, end-*p.StoredOffset)
			} else if so, ok := st.starts.Lookup(p.Topic, p.Partition); ok {
				lag = max(0, end-so.Offset)
			}
			p.Lag = &lag
			total += lag
		}
		s.Lag = &total
	}
	sort.Slice(s.Partitions, func(i, j int) bool {
		a, b := s.Partitions[i], s.Partitions[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
}

const (
	pollStateSQL = `
SELECT CASE WHEN high_watermark = '-infinity' THEN NULL ELSE high_watermark END,
       last_upper, last_run_at, advanced_at, runs, rows_read, rows_merged
FROM tidemark.poll_watermarks WHERE source = $1`

	lastKeyCheckSQL = `
SELECT finished_at, dry_run, mode, source_keys, mirror_keys, keys_transferred, missing_at_source, missing_in_mirror, applied
FROM tidemark.key_reconciliations WHERE source = $1 ORDER BY id DESC LIMIT 1`
)

func gatherPoll(ctx context.Context, q Querier, sc *config.Source, version int) (*Poll, error) {
	p := &Poll{Table: sc.Poll.Table, Mirror: sc.Mirror.Table}
	if version < 3 {
		return p, nil
	}
	var hw, upper, ran, adv *time.Time
	err := q.QueryRow(ctx, pollStateSQL, sc.Name).Scan(&hw, &upper, &ran, &adv, &p.Runs, &p.RowsRead, &p.RowsMerged)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the poll state of source %s: %w", sc.Name, err)
	}
	p.HighWatermark, p.LastUpper, p.LastRunAt, p.AdvancedAt = utc(hw), utc(upper), utc(ran), utc(adv)
	var k KeyCheck
	err = q.QueryRow(ctx, lastKeyCheckSQL, sc.Name).Scan(&k.FinishedAt, &k.DryRun, &k.Mode, &k.SourceKeys, &k.MirrorKeys,
		&k.KeysTransferred, &k.MissingAtSource, &k.MissingInMirror, &k.Applied)
	switch {
	case err == nil:
		k.FinishedAt = k.FinishedAt.UTC()
		p.LastKeyCheck = &k
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read the key reconciliations of source %s: %w", sc.Name, err)
	}
	return p, nil
}

const cdcStateSQL = `
SELECT snapshot, applied_lsn::text, confirmed_lsn::text, last_commit_time, transactions, changes, updated_at
FROM tidemark.cdc_positions WHERE source = $1`

func gatherCDC(ctx context.Context, q Querier, sc *config.Source, version int, now time.Time) (*CDC, error) {
	c := &CDC{Slot: sc.CDC.Slot, Tables: sc.CDC.Tables, Resyncs: []Resync{}}
	if version < 4 {
		return c, nil
	}
	var last, upd *time.Time
	err := q.QueryRow(ctx, cdcStateSQL, sc.Name).Scan(&c.Snapshot, &c.AppliedLSN, &c.ConfirmedLSN, &last, &c.Transactions, &c.Changes, &upd)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the CDC position of source %s: %w", sc.Name, err)
	}
	c.LastCommitTime, c.UpdatedAt = utc(last), utc(upd)
	if version >= resyncsVersion {
		if c.Resyncs, err = gatherResyncs(ctx, q, sc.Name, version, now); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// resyncsVersion is the schema version that made tidemark.cdc_resyncs,
// plannedVersion the one that added its rows_planned.
const (
	resyncsVersion = 16
	plannedVersion = 17
)

// resyncsSQL reads a source's resyncs not done, the one copying first and
// the others in the order the reader takes them, then the last one that
// ended. %s is rows_planned, or NULL
// before the schema had it.
const resyncsSQL = `
SELECT source_table, generation, state, requested_at, requested_by, started_at, finished_at, chunks, rows_copied, rows_removed, %s
FROM tidemark.cdc_resyncs
WHERE source = $1 AND (state <> 'done'
    OR finished_at = (SELECT max(finished_at) FROM tidemark.cdc_resyncs WHERE source = $1 AND state = 'done'))
ORDER BY state = 'done', state <> 'copying', requested_at, source_table`

// gatherResyncs reads the resyncs of source with their progress at now.
func gatherResyncs(ctx context.Context, q Querier, source string, version int, now time.Time) ([]Resync, error) {
	planned := "rows_planned"
	if version < plannedVersion {
		planned = "NULL::bigint"
	}
	rows, err := q.Query(ctx, fmt.Sprintf(resyncsSQL, planned), source)
	if err != nil {
		return nil, fmt.Errorf("read the resyncs of source %s: %w", source, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Resync, error) {
		var r Resync
		err := row.Scan(&r.Table, &r.Generation, &r.State, &r.RequestedAt, &r.RequestedBy, &r.StartedAt, &r.FinishedAt,
			&r.Chunks, &r.RowsCopied, &r.RowsRemoved, &r.RowsPlanned)
		r.RequestedAt, r.StartedAt, r.FinishedAt = r.RequestedAt.UTC(), utc(r.StartedAt), utc(r.FinishedAt)
		r.progress(now)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the resyncs of source %s: %w", source, err)
	}
	return out, nil
}

// progress sets r's percent, rate and time left, at now.
func (r *Resync) progress(now time.Time) {
	pct := func(p float64) *float64 { return &p }
	switch {
	case r.State == "done":
		r.Percent = pct(100)
	case r.RowsPlanned != nil && *r.RowsPlanned > 0 && r.State == "copying":
		// Not 100 before the last chunk, however short the estimate.
		r.Percent = pct(min(99.9, 100*float64(r.RowsCopied)/float64(*r.RowsPlanned)))
	}
	if r.StartedAt == nil || r.State == "pending" {
		return
	}
	end := now
	if r.FinishedAt != nil {
		end = *r.FinishedAt
	}
	secs := end.Sub(*r.StartedAt).Seconds()
	if secs <= 0 {
		return
	}
	rate := float64(r.RowsCopied) / secs
	r.RowsPerSecond = &rate
	if r.State == "copying" && rate > 0 && r.RowsPlanned != nil && *r.RowsPlanned > r.RowsCopied {
		eta := float64(*r.RowsPlanned-r.RowsCopied) / rate
		r.ETASeconds = &eta
	}
}

const rawRetentionSQL = `SELECT retained_from, partitions_dropped FROM tidemark.raw_retention WHERE source = $1`

// gatherRaw reads what the raw table of source sc holds.
func gatherRaw(ctx context.Context, q Querier, sc *config.Source, version int) (*Raw, error) {
	raw := &Raw{Table: "raw." + sc.Name, Retention: sc.Retention.Raw.String()}
	parts, err := retention.RawPartitions(ctx, q, sc.Name)
	if err != nil {
		return nil, err
	}
	raw.Partitions = len(parts)
	for _, p := range parts {
		raw.Bytes += p.Bytes
	}
	if len(parts) > 0 {
		raw.Oldest = &parts[0].Start
	}
	if version < 6 {
		return raw, nil
	}
	err = q.QueryRow(ctx, rawRetentionSQL, sc.Name).Scan(&raw.RetainedFrom, &raw.PartitionsDropped)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the retention of %s: %w", raw.Table, err)
	}
	raw.RetainedFrom = utc(raw.RetainedFrom)
	return raw, nil
}

// gatherUnconfigured lists the registered aggregates cfg does not name.
func gatherUnconfigured(ctx context.Context, q Querier, cfg *config.Config) ([]Unconfigured, error) {
	reg, err := aggregate.Registry(ctx, q)
	if err != nil {
		return nil, err
	}
	out := []Unconfigured{}
	for _, a := range reg {
		if cfg.Aggregates[a.Name] != nil {
			continue
		}
		u := Unconfigured{Name: a.Name, Source: a.Source}
		if a.Defined {
			u.Horizon = config.Duration(a.Horizon).String()
		}
		if err := q.QueryRow(ctx, "SELECT last_run_at FROM tidemark.load_watermarks WHERE aggregate = $1", a.Name).Scan(&u.LastRunAt); err != nil {
			return nil, fmt.Errorf("read aggregate %s: %w", a.Name, err)
		}
		u.LastRunAt = utc(u.LastRunAt)
		out = append(out, u)
	}
	return out, nil
}

const (
	aggregateStateSQL = `
SELECT w.load_xid::text, w.ingested_through, w.advanced_at, w.last_run_at,
       (SELECT event_time_watermark FROM tidemark.source_watermarks s WHERE s.source = w.source),
       (SELECT count(*) FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)
FROM tidemark.load_watermarks w WHERE w.aggregate = $1`

	lastBackfillSQL = `
SELECT id, kind, status, range_start, range_end, reprocess, chunks, chunks_done, chunks_failed, started_at, finished_at
FROM tidemark.backfill_runs WHERE aggregate = $1 ORDER BY id DESC LIMIT 1`

	// failingPartitionsSQL lists the queued partitions whose last rebuild
	// failed, longest failing first, with their number.
	failingPartitionsSQL = `
SELECT partition_start, partition_end, attempts, failing_since, next_attempt_at, coalesce(last_error, ''), count(*) OVER ()
FROM tidemark.pending_partitions WHERE aggregate = $1 AND attempts > 0
ORDER BY failing_since NULLS FIRST, partition_start DESC LIMIT $2`

	// recentPartitionsSQL lists the newest partitions of an aggregate,
	// built ones and queued ones never built yet, with whether each waits
	// in the queue and how many rebuilds of it failed since it was queued.
	recentPartitionsSQL = `
WITH keys AS (
    (SELECT partition_start, partition_end FROM tidemark.partitions WHERE aggregate = $1 ORDER BY partition_start DESC LIMIT $2)
    UNION
    (SELECT partition_start, partition_end FROM tidemark.pending_partitions WHERE aggregate = $1 ORDER BY partition_start DESC LIMIT $2)
)
SELECT coalesce(p.partition_key, ''), k.partition_start, k.partition_end, coalesce(p.state, 'queued'), p.rows, p.completeness, p.rebuilt_at,
       coalesce(p.rebuilds, 0), p.final_at, q.partition_start IS NOT NULL, coalesce(q.attempts, 0)
FROM keys k
LEFT JOIN tidemark.partitions p ON p.aggregate = $1 AND p.partition_start = k.partition_start
LEFT JOIN tidemark.pending_partitions q ON q.aggregate = $1 AND q.partition_start = k.partition_start
ORDER BY k.partition_start DESC LIMIT $2`

	// oldestTransactionSQL finds the transaction with the oldest id among
	// running and prepared ones: the reconciler's load watermarks cannot
	// pass it.
	oldestTransactionSQL = `
SELECT xid::text, pid, extract(epoch FROM now() - started)::float8, state, app, gid
FROM (
    SELECT backend_xid AS xid, pid, xact_start AS started, coalesce(state, '') AS state, coalesce(application_name, '') AS app, '' AS gid
    FROM pg_stat_activity WHERE backend_xid IS NOT NULL
    UNION ALL
    SELECT transaction, 0, prepared, 'prepared', '', gid FROM pg_prepared_xacts
) t
ORDER BY age(xid) DESC LIMIT 1`
)

func gatherAggregates(ctx context.Context, q Querier, cfg *config.Config, r *Report) error {
	var tx Transaction
	err := q.QueryRow(ctx, oldestTransactionSQL).Scan(&tx.XID, &tx.PID, &tx.Seconds, &tx.State, &tx.ApplicationName, &tx.PreparedGID)
	switch {
	case err == nil:
		r.OldestTransaction = &tx
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("read running transactions: %w", err)
	}
	for _, name := range cfg.AggregateNames() {
		a := cfg.Aggregates[name]
		ag := Aggregate{Name: name, Source: a.Source, Table: a.Table, Policy: a.BeyondHorizon, Horizon: a.LatenessHorizon.String(),
			HorizonSeconds: int64(a.LatenessHorizon.Duration() / time.Second),
			Partition:      a.Partition.By + " in " + a.Partition.TimeZone, Partitions: []AggPartition{}, Failing: []FailingPartition{}}
		err := q.QueryRow(ctx, aggregateStateSQL, name).Scan(&ag.LoadWatermark, &ag.IngestedThrough, &ag.WatermarkMovedAt,
			&ag.LastRunAt, &ag.EventTimeWatermark, &ag.Queued)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read the state of aggregate %s: %w", name, err)
		}
		rows, err := q.Query(ctx, recentPartitionsSQL, name, RecentPartitions)
		if err != nil {
			return fmt.Errorf("read the partitions of aggregate %s: %w", name, err)
		}
		cal := aggregate.Calendar{By: a.Partition.By, Loc: a.Partition.Location()}
		ag.Partitions, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (AggPartition, error) {
			var p AggPartition
			var final *time.Time
			err := row.Scan(&p.Key, &p.Start, &p.End, &p.State, &p.Rows, &p.Completeness, &p.RebuiltAt, &p.Rebuilds, &final, &p.Queued, &p.FailedAttempts)
			if p.Key == "" {
				p.Key = cal.At(p.Start).Label()
			}
			p.Start, p.End, p.RebuiltAt = p.Start.UTC(), p.End.UTC(), utc(p.RebuiltAt)
			if final != nil {
				p.FinalAt = final.UTC()
			} else {
				p.FinalAt = p.End.Add(a.LatenessHorizon.Duration()).UTC()
			}
			return p, err
		})
		if err != nil {
			return fmt.Errorf("read the partitions of aggregate %s: %w", name, err)
		}
		for _, t := range []**time.Time{&ag.IngestedThrough, &ag.WatermarkMovedAt, &ag.LastRunAt, &ag.EventTimeWatermark} {
			*t = utc(*t)
		}
		if r.SchemaVersion >= 6 {
			if err := gatherFailing(ctx, q, name, a, &ag); err != nil {
				return err
			}
		}
		if r.SchemaVersion >= 5 {
			var b Backfill
			err := q.QueryRow(ctx, lastBackfillSQL, name).Scan(&b.Run, &b.Kind, &b.Status, &b.RangeStart, &b.RangeEnd, &b.Reprocess,
				&b.Chunks, &b.ChunksDone, &b.ChunksFailed, &b.StartedAt, &b.FinishedAt)
			switch {
			case err == nil:
				b.RangeStart, b.RangeEnd, b.StartedAt, b.FinishedAt = b.RangeStart.UTC(), b.RangeEnd.UTC(), b.StartedAt.UTC(), utc(b.FinishedAt)
				ag.LastBackfill = &b
			case !errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("read the backfills of aggregate %s: %w", name, err)
			}
		}
		if r.SchemaVersion >= 6 {
			if err := gatherRetention(ctx, q, name, &ag); err != nil {
				return err
			}
		}
		r.Aggregates = append(r.Aggregates, ag)
	}
	return nil
}

// gatherFailing reads the failing partitions of aggregate name (a) into ag.
func gatherFailing(ctx context.Context, q Querier, name string, a *config.Aggregate, ag *Aggregate) error {
	rows, err := q.Query(ctx, failingPartitionsSQL, name, maxFailing)
	if err != nil {
		return fmt.Errorf("read the failing partitions of aggregate %s: %w", name, err)
	}
	cal := aggregate.Calendar{By: a.Partition.By, Loc: a.Partition.Location()}
	ag.Failing, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (FailingPartition, error) {
		var f FailingPartition
		err := row.Scan(&f.Start, &f.End, &f.Attempts, &f.FailingSince, &f.NextAttempt, &f.LastError, &ag.FailingCount)
		f.Key, f.Start, f.End, f.FailingSince, f.NextAttempt = cal.At(f.Start).Label(), f.Start.UTC(), f.End.UTC(), utc(f.FailingSince), utc(f.NextAttempt)
		return f, err
	})
	if err != nil {
		return fmt.Errorf("read the failing partitions of aggregate %s: %w", name, err)
	}
	return nil
}

const (
	lastVerifySQL = `
SELECT scheduled, started_at, finished_at, partitions, drifted, skipped_queued, skipped_archived, coalesce(error, '')
FROM tidemark.verify_runs WHERE aggregate = $1 ORDER BY id DESC LIMIT 1`
	archivedCountSQL = `SELECT count(*) FROM tidemark.partitions WHERE aggregate = $1 AND state = 'archived'`
)

// gatherRetention reads the aggregate's archived partitions and last
// verification into ag.
func gatherRetention(ctx context.Context, q Querier, name string, ag *Aggregate) error {
	if err := q.QueryRow(ctx, archivedCountSQL, name).Scan(&ag.Archived); err != nil {
		return fmt.Errorf("read the archived partitions of aggregate %s: %w", name, err)
	}
	var v Verify
	err := q.QueryRow(ctx, lastVerifySQL, name).Scan(&v.Scheduled, &v.StartedAt, &v.FinishedAt, &v.Partitions, &v.Drifted,
		&v.Pending, &v.Archived, &v.Error)
	switch {
	case err == nil:
		v.StartedAt, v.FinishedAt = v.StartedAt.UTC(), utc(v.FinishedAt)
		ag.LastVerify = &v
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("read the verifications of aggregate %s: %w", name, err)
	}
	return nil
}

// deadLetterReasonsSQL counts dead letters by source and reason, and
// those not replayed; deadLetterReasonsV11SQL is the same for a schema
// before version 12, which had no replays.
const (
	deadLetterReasonsSQL = `SELECT source, reason, count(*), count(*) FILTER (WHERE replayed_at IS NULL)
FROM tidemark.dead_letters GROUP BY source, reason`
	deadLetterReasonsV11SQL = `SELECT source, reason, count(*), count(*) FROM tidemark.dead_letters GROUP BY source, reason`
)

// deadLetterReasons reads the dead letters by source and reason, and by
// source those not replayed; v is the schema version.
func deadLetterReasons(ctx context.Context, q Querier, v int) (map[string]map[string]int64, map[string]int64, error) {
	query := deadLetterReasonsSQL
	if v < 12 {
		query = deadLetterReasonsV11SQL
	}
	rows, err := q.Query(ctx, query)
	if err != nil {
		return nil, nil, fmt.Errorf("read dead letters: %w", err)
	}
	defer rows.Close()
	out, open := map[string]map[string]int64{}, map[string]int64{}
	for rows.Next() {
		var src, reason string
		var n, notReplayed int64
		if err := rows.Scan(&src, &reason, &n, &notReplayed); err != nil {
			return nil, nil, fmt.Errorf("read dead letters: %w", err)
		}
		if out[src] == nil {
			out[src] = map[string]int64{}
		}
		out[src][reason] = n
		open[src] += notReplayed
	}
	return out, open, rows.Err()
}

func key(topic string, p int32) string { return fmt.Sprintf("%s/%d", topic, p) }

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
