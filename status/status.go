// Package status builds the operator's view of a tidemark deployment from
// the warehouse (and, for lag, the Kafka brokers): per source the stored
// offsets, end offsets and lag of each partition, the event-time
// watermark, row, duplicate and dead-letter totals; per aggregate the load
// watermark and what holds it back (the oldest running transaction), the
// event-time watermark, the queue, and recent partitions with their state,
// rows, completeness and rebuild and final times. `tidemark status` prints
// it as text or JSON and the HTTP server serves it at /status.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/retention"
)

// Report is the whole view.
type Report struct {
	GeneratedAt   time.Time   `json:"generated_at"`
	SchemaVersion int         `json:"schema_version"`
	Sources       []Source    `json:"sources"`
	Aggregates    []Aggregate `json:"aggregates"`
	// OldestTransaction is the warehouse's oldest transaction holding a
	// transaction id: no load watermark can pass it.
	OldestTransaction *Transaction `json:"oldest_transaction"`
	// Unconfigured are the aggregates the warehouse has registered that
	// the configuration does not name: retention keeps what they need
	// until they return or `tidemark forget` removes their state.
	Unconfigured []Unconfigured `json:"unconfigured_aggregates"`
}

// Unconfigured is an aggregate registered in the warehouse (it has been
// reconciled) that the configuration does not name.
type Unconfigured struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	// Horizon is its recorded lateness horizon ("" when none was).
	Horizon   string     `json:"lateness_horizon"`
	LastRunAt *time.Time `json:"last_run_at"`
}

// Aggregate is the view of one aggregate.
type Aggregate struct {
	Name      string `json:"name"`
	Source    string `json:"source"`
	Table     string `json:"table"`
	Partition string `json:"partition"` // e.g. "day in UTC"
	Horizon   string `json:"lateness_horizon"`
	// HorizonSeconds is the horizon in seconds.
	HorizonSeconds int64  `json:"lateness_horizon_seconds"`
	Policy         string `json:"beyond_horizon"`
	// LoadWatermark is an xid for ledger sources; IngestedThrough the
	// newest ingestion time read, for table sources.
	LoadWatermark      string         `json:"load_watermark"`
	IngestedThrough    *time.Time     `json:"ingested_through,omitempty"`
	WatermarkMovedAt   *time.Time     `json:"watermark_moved_at"`
	LastRunAt          *time.Time     `json:"last_run_at"`
	EventTimeWatermark *time.Time     `json:"event_time_watermark"`
	Queued             int64          `json:"queued_partitions"`
	Partitions         []AggPartition `json:"recent_partitions"`
	// FailingCount counts the queued partitions whose last rebuild
	// failed; Failing lists up to maxFailing of them, longest failing
	// first.
	FailingCount int64              `json:"failing_partitions"`
	Failing      []FailingPartition `json:"failing"`
	// LastBackfill is the latest backfill or refresh run, if any.
	LastBackfill *Backfill `json:"last_backfill,omitempty"`
	// Archived counts the partitions retention archived.
	Archived int64 `json:"archived_partitions"`
	// LastVerify is the latest verification, scheduled or by hand.
	LastVerify *Verify `json:"last_verify,omitempty"`
}

// Verify is one verification of an aggregate (`tidemark verify`, or
// aggregates.<name>.verify_every).
type Verify struct {
	Scheduled  bool       `json:"scheduled"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Partitions int        `json:"partitions"`
	// Drifted counts partitions that differ from a rebuild with no pending
	// work to explain it; Pending those loads or the queue explain.
	Drifted  int    `json:"drifted"`
	Pending  int    `json:"pending"`
	Archived int    `json:"archived"`
	Error    string `json:"error,omitempty"`
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

// Backfill is one run of `tidemark backfill` or `tidemark refresh`.
type Backfill struct {
	Run    int64  `json:"run"`
	Kind   string `json:"kind"`
	Status string `json:"status"`
	// RangeStart and RangeEnd bound the days asked for: [start of the
	// first, start of the day after the last).
	RangeStart   time.Time  `json:"range_start"`
	RangeEnd     time.Time  `json:"range_end"`
	Reprocess    string     `json:"reprocess"`
	Chunks       int        `json:"chunks"`
	ChunksDone   int        `json:"chunks_done"`
	ChunksFailed int        `json:"chunks_failed"`
	StartedAt    time.Time  `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at"`
}

// RecentPartitions is how many of an aggregate's newest partitions the
// report shows.
const RecentPartitions = 14

// AggPartition is the status of one aggregate partition.
type AggPartition struct {
	Key   string    `json:"partition"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// State is open, closed, final or archived, or queued for a partition
	// queued for its first build.
	State string `json:"state"`
	// Queued says the partition waits in the queue to be rebuilt;
	// FailedAttempts counts the rebuilds of it that failed since.
	Queued         bool       `json:"queued"`
	FailedAttempts int64      `json:"failed_attempts"`
	Rows           *int64     `json:"rows"`
	Completeness   *float64   `json:"completeness"`
	RebuiltAt      *time.Time `json:"rebuilt_at"`
	Rebuilds       int64      `json:"rebuilds"`
	// FinalAt is when the partition is final: its end plus the horizon.
	FinalAt time.Time `json:"final_at"`
}

// FailingPartition is a queued partition whose last rebuild failed: the
// reconciler tries it again at NextAttempt, with a delay that grows with
// each failure.
type FailingPartition struct {
	Key          string     `json:"partition"`
	Start        time.Time  `json:"start"`
	End          time.Time  `json:"end"`
	Attempts     int64      `json:"attempts"`
	FailingSince *time.Time `json:"failing_since"`   // null for failures recorded before schema version 6
	NextAttempt  *time.Time `json:"next_attempt_at"` // null: at the next run
	LastError    string     `json:"last_error"`
}

// maxFailing is how many failing partitions an aggregate's report lists.
const maxFailing = 5

// Transaction describes a running warehouse transaction: who runs it, not
// what it runs. Its statement text is never shown, since it may hold
// secrets (an ALTER ROLE ... PASSWORD, literals of other applications).
type Transaction struct {
	XID             string  `json:"xid"`
	PID             int32   `json:"pid"`
	Seconds         float64 `json:"running_seconds"`
	State           string  `json:"state"`
	ApplicationName string  `json:"application_name"`
	// PreparedGID names a prepared transaction (PID 0), which COMMIT
	// PREPARED or ROLLBACK PREPARED ends.
	PreparedGID string `json:"prepared_gid,omitempty"`
}

// Source is the view of one source.
type Source struct {
	Name                string           `json:"name"`
	Kind                string           `json:"kind"`
	Topics              []string         `json:"topics,omitempty"`
	EventTimeWatermark  *time.Time       `json:"event_time_watermark"`
	Records             int64            `json:"records"`
	Rows                int64            `json:"rows"`
	Duplicates          int64            `json:"duplicates"`
	DeadLetters         int64            `json:"dead_letters"`
	DeadLettersByReason map[string]int64 `json:"dead_letters_by_reason"`
	// DeadLettersNotReplayed counts the rows of DeadLettersByReason not
	// yet loaded by a replay.
	DeadLettersNotReplayed int64       `json:"dead_letters_not_replayed"`
	Lag                    *int64      `json:"lag"`
	KafkaError             string      `json:"kafka_error,omitempty"`
	Partitions             []Partition `json:"partitions"`
	// Poll is the state of a poll source.
	Poll *Poll `json:"poll,omitempty"`
	// CDC is the state of a CDC source.
	CDC *CDC `json:"cdc,omitempty"`
	// Raw is what the raw table of a Kafka, poll or CDC source holds, and
	// what retention dropped.
	Raw *Raw `json:"raw,omitempty"`
}

// Raw is a source's raw table under retention.
type Raw struct {
	Table      string `json:"table"`
	Partitions int    `json:"partitions"`
	Bytes      int64  `json:"bytes"`
	// Oldest is the start of the oldest partition held: the oldest day
	// retained.
	Oldest *time.Time `json:"oldest_partition"`
	// RetainedFrom is the retention bound: raw rows with earlier event
	// times were dropped, and aggregate partitions starting before it are
	// archived. Null while nothing has been dropped. A late event for an
	// earlier day makes a partition before it again, which the next prune
	// drops.
	RetainedFrom      *time.Time `json:"retained_from"`
	PartitionsDropped int64      `json:"partitions_dropped"`
	// Retention is sources.<name>.retention.raw.
	Retention string `json:"retention"`
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

// CDC is the state of a CDC source as the warehouse records it; the
// slot's lag is a metric (tidemark_cdc_slot_lag_bytes).
type CDC struct {
	Slot           string     `json:"slot"`
	Tables         []string   `json:"tables"`
	Snapshot       string     `json:"snapshot"` // pending, done, skipped; "" before the first start
	AppliedLSN     string     `json:"applied_lsn"`
	ConfirmedLSN   string     `json:"confirmed_lsn"`
	LastCommitTime *time.Time `json:"last_commit_time"`
	Transactions   int64      `json:"transactions"`
	Changes        int64      `json:"changes"`
	UpdatedAt      *time.Time `json:"updated_at"`
}

const cdcStateSQL = `
SELECT snapshot, applied_lsn::text, confirmed_lsn::text, last_commit_time, transactions, changes, updated_at
FROM tidemark.cdc_positions WHERE source = $1`

func gatherCDC(ctx context.Context, q Querier, sc *config.Source, version int) (*CDC, error) {
	c := &CDC{Slot: sc.CDC.Slot, Tables: sc.CDC.Tables}
	if version < 4 {
		return c, nil
	}
	var last, upd *time.Time
	err := q.QueryRow(ctx, cdcStateSQL, sc.Name).Scan(&c.Snapshot, &c.AppliedLSN, &c.ConfirmedLSN, &last, &c.Transactions, &c.Changes, &upd)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the CDC position of source %s: %w", sc.Name, err)
	}
	c.LastCommitTime, c.UpdatedAt = utc(last), utc(upd)
	return c, nil
}

// Poll is the state of a poll source: its watermark, its last run and its
// last key reconciliation.
type Poll struct {
	Table         string     `json:"table"`
	Mirror        string     `json:"mirror"`
	HighWatermark *time.Time `json:"high_watermark"` // null: nothing loaded yet
	LastUpper     *time.Time `json:"last_upper"`
	LastRunAt     *time.Time `json:"last_run_at"`
	AdvancedAt    *time.Time `json:"advanced_at"`
	Runs          int64      `json:"runs"`
	RowsRead      int64      `json:"rows_read"`
	RowsMerged    int64      `json:"rows_merged"`
	LastKeyCheck  *KeyCheck  `json:"last_key_reconciliation"`
}

// KeyCheck is the outcome of one key reconciliation.
type KeyCheck struct {
	FinishedAt      time.Time `json:"finished_at"`
	DryRun          bool      `json:"dry_run"`
	Mode            string    `json:"mode"`
	SourceKeys      int64     `json:"source_keys"`
	MirrorKeys      int64     `json:"mirror_keys"`
	KeysTransferred int64     `json:"keys_transferred"`
	MissingAtSource int64     `json:"missing_at_source"`
	MissingInMirror int64     `json:"missing_in_mirror"`
	Applied         int64     `json:"applied"`
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

// Partition is the view of one Kafka partition of a source.
type Partition struct {
	Topic        string     `json:"topic"`
	Partition    int32      `json:"partition"`
	StoredOffset *int64     `json:"stored_offset"` // null: nothing stored yet
	EndOffset    *int64     `json:"end_offset"`    // null: brokers unreachable
	Lag          *int64     `json:"lag"`
	MaxEventTime *time.Time `json:"max_event_time"`
	UpdatedAt    *time.Time `json:"updated_at"`
}

// Querier reads from the warehouse.
type Querier interface {
	raw.Querier
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

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
	for _, name := range cfg.SourceNames() {
		s, err := gatherSource(ctx, q, name, cfg.Sources[name], v, &st, now)
		if err != nil {
			return nil, err
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
		if s.CDC, err = gatherCDC(ctx, q, sc, v); err != nil {
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

func key(topic string, p int32) string { return fmt.Sprintf("%s/%d", topic, p) }

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
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

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "tidemark status at %s (schema version %d)\n", r.GeneratedAt.Format(time.RFC3339), r.SchemaVersion)
	for _, s := range r.Sources {
		switch {
		case s.Poll != nil:
			writePoll(tw, s)
		case s.CDC != nil:
			writeCDC(tw, s)
		case s.Kind != "kafka":
			fmt.Fprintf(tw, "\nsource %s (table, read by the reconciler in timestamp mode)\n", s.Name)
			fmt.Fprintf(tw, "  event-time watermark\t%s\n", fmtTime(s.EventTimeWatermark))
		default:
			writeKafka(tw, s)
		}
	}
	if len(r.Aggregates) > 0 {
		// The sources' columns end here.
		if err := tw.Flush(); err != nil {
			return err
		}
		if t := r.OldestTransaction; t != nil {
			who := "application " + strconv.Quote(t.ApplicationName)
			if t.PreparedGID != "" {
				who = "prepared transaction " + strconv.Quote(t.PreparedGID)
			}
			fmt.Fprintf(tw, "\noldest warehouse transaction (load watermarks cannot pass it): xid %s, pid %d, %s, running %.0fs, %s\n",
				t.XID, t.PID, who, t.Seconds, t.State)
		}
	}
	for _, a := range r.Aggregates {
		writeAggregate(tw, a)
	}
	for _, u := range r.Unconfigured {
		fmt.Fprintf(tw, "\naggregate %s (not in this configuration: source %s, horizon %s, last run %s)\n",
			u.Name, u.Source, orDash(u.Horizon), fmtTime(u.LastRunAt))
		fmt.Fprintf(tw, "  retention keeps the raw partitions and ledger rows it needs; once it is gone for good, tidemark forget --aggregate %s releases them\n", u.Name)
	}
	return tw.Flush()
}

// writePoll writes a poll source: its watermark, runs, last key
// reconciliation and raw table.
func writePoll(w io.Writer, s Source) {
	p := s.Poll
	fmt.Fprintf(w, "\nsource %s (poll: %s into %s)\n", s.Name, p.Table, p.Mirror)
	fmt.Fprintf(w, "  high watermark (updated_at)\t%s\n", fmtTime(p.HighWatermark))
	fmt.Fprintf(w, "  last window upper bound\t%s\n", fmtTime(p.LastUpper))
	fmt.Fprintf(w, "  last run\t%s (watermark last moved %s)\n", fmtTime(p.LastRunAt), fmtTime(p.AdvancedAt))
	fmt.Fprintf(w, "  runs / rows read / rows merged\t%d / %d / %d\n", p.Runs, p.RowsRead, p.RowsMerged)
	if k := p.LastKeyCheck; k != nil {
		dry := ""
		if k.DryRun {
			dry = " (dry run)"
		}
		fmt.Fprintf(w, "  last key reconciliation%s\t%s: %d source keys, %d mirror keys, %d transferred; %d missing at the source (%s, %d applied), %d not yet in the mirror\n",
			dry, k.FinishedAt.Format(time.RFC3339), k.SourceKeys, k.MirrorKeys, k.KeysTransferred, k.MissingAtSource, k.Mode, k.Applied, k.MissingInMirror)
	} else {
		fmt.Fprintf(w, "  last key reconciliation\tnever\n")
	}
	writeRaw(w, s.Raw)
}

// writeCDC writes a CDC source: its snapshot, positions and raw table.
func writeCDC(w io.Writer, s Source) {
	c := s.CDC
	fmt.Fprintf(w, "\nsource %s (cdc: slot %s, %s)\n", s.Name, c.Slot, strings.Join(c.Tables, ", "))
	snap := c.Snapshot
	if snap == "" {
		snap = "not started"
	}
	fmt.Fprintf(w, "  snapshot\t%s\n", snap)
	fmt.Fprintf(w, "  applied / confirmed LSN\t%s / %s\n", orDash(c.AppliedLSN), orDash(c.ConfirmedLSN))
	fmt.Fprintf(w, "  last source commit applied\t%s\n", fmtTime(c.LastCommitTime))
	fmt.Fprintf(w, "  transactions / changes\t%d / %d\n", c.Transactions, c.Changes)
	writeRaw(w, s.Raw)
}

// writeKafka writes a Kafka source: what it read and stored, its raw
// table, and its lag per partition.
func writeKafka(w io.Writer, s Source) {
	fmt.Fprintf(w, "\nsource %s (%s: %s)\n", s.Name, s.Kind, strings.Join(s.Topics, ", "))
	fmt.Fprintf(w, "  event-time watermark\t%s\n", fmtTime(s.EventTimeWatermark))
	fmt.Fprintf(w, "  records read\t%d\n", s.Records)
	fmt.Fprintf(w, "  rows\t%d\n", s.Rows)
	fmt.Fprintf(w, "  duplicates dropped\t%d\n", s.Duplicates)
	fmt.Fprintf(w, "  dead letters\t%d%s%s\n", s.DeadLetters, fmtReasons(s.DeadLettersByReason), fmtNotReplayed(s))
	writeRaw(w, s.Raw)
	fmt.Fprintf(w, "  lag\t%s\n", fmtInt(s.Lag))
	if s.KafkaError != "" {
		fmt.Fprintf(w, "  kafka\tunavailable: %s\n", s.KafkaError)
	}
	fmt.Fprintf(w, "  partition\tstored offset\tend offset\tlag\tmax event time\n")
	for _, p := range s.Partitions {
		fmt.Fprintf(w, "  %s/%d\t%s\t%s\t%s\t%s\n", p.Topic, p.Partition, fmtInt(p.StoredOffset), fmtInt(p.EndOffset),
			fmtInt(p.Lag), fmtTime(p.MaxEventTime))
	}
}

// fmtNotReplayed says how many stored dead letters are not replayed, when
// some are replayed.
func fmtNotReplayed(s Source) string {
	var stored int64
	for _, n := range s.DeadLettersByReason {
		stored += n
	}
	if stored == s.DeadLettersNotReplayed {
		return ""
	}
	return fmt.Sprintf(", %d not replayed", s.DeadLettersNotReplayed)
}

// writeAggregate writes an aggregate: its watermarks, queue, failing and
// archived partitions, last verification and backfill, and its recent
// partitions.
func writeAggregate(w io.Writer, a Aggregate) {
	fmt.Fprintf(w, "\naggregate %s (source %s, table %s, %s partitions, horizon %s, beyond horizon: %s)\n",
		a.Name, a.Source, a.Table, a.Partition, a.Horizon, a.Policy)
	wm := "xid " + a.LoadWatermark
	if a.IngestedThrough != nil {
		wm = "ingested through " + fmtTime(a.IngestedThrough)
	}
	fmt.Fprintf(w, "  load watermark\t%s (moved %s, last run %s)\n", wm, fmtTime(a.WatermarkMovedAt), fmtTime(a.LastRunAt))
	fmt.Fprintf(w, "  event-time watermark\t%s\n", fmtTime(a.EventTimeWatermark))
	fmt.Fprintf(w, "  queued partitions\t%d\n", a.Queued)
	if a.FailingCount > 0 {
		fmt.Fprintf(w, "  failing partitions\t%d\n", a.FailingCount)
		for _, f := range a.Failing {
			fmt.Fprintf(w, "    %s\t%s\n", f.Key, f.Text())
		}
		if more := a.FailingCount - int64(len(a.Failing)); more > 0 {
			fmt.Fprintf(w, "    … and %d more\n", more)
		}
	}
	if a.Archived > 0 {
		fmt.Fprintf(w, "  archived partitions\t%d (retention dropped their raw rows; they are never rebuilt)\n", a.Archived)
	}
	if v := a.LastVerify; v != nil {
		how := "by hand"
		if v.Scheduled {
			how = "scheduled"
		}
		result := fmt.Sprintf("%d partitions compared, %d differ, %d await the reconciler, %d archived", v.Partitions, v.Drifted, v.Pending, v.Archived)
		if v.Error != "" {
			result = "failed: " + strings.Join(strings.Fields(v.Error), " ")
		}
		fmt.Fprintf(w, "  last verify\t%s (%s): %s\n", fmtTime(v.FinishedAt), how, result)
	}
	if b := a.LastBackfill; b != nil {
		fmt.Fprintf(w, "  last %s\trun %d, %s .. %s, --reprocess %s: %s, %d of %d chunks done, %d failed (started %s, finished %s)\n",
			b.Kind, b.Run, fmtTime(&b.RangeStart), fmtTime(&b.RangeEnd), b.Reprocess, b.Status, b.ChunksDone, b.Chunks, b.ChunksFailed,
			fmtTime(&b.StartedAt), fmtTime(b.FinishedAt))
	}
	fmt.Fprintf(w, "  partition\tstate\trows\tcompleteness\trebuilt at\tfinal at\n")
	for _, p := range a.Partitions {
		state := p.State
		if p.Queued && state != "queued" {
			state += " (queued)"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", p.Key, state, fmtInt(p.Rows), fmtRatio(p.Completeness),
			fmtTime(p.RebuiltAt), p.FinalAt.UTC().Format(time.RFC3339))
	}
}

// writeRaw writes what a source's raw table holds: its partitions from
// the oldest day retained, and how far retention has dropped.
func writeRaw(w io.Writer, r *Raw) {
	if r == nil {
		return
	}
	oldest := "-"
	if r.Oldest != nil {
		oldest = r.Oldest.Format(time.DateOnly)
	}
	fmt.Fprintf(w, "  raw\t%s: %s, %s, oldest day retained %s (retention %s)", r.Table, plural(int64(r.Partitions), "partition"), fmtBytes(r.Bytes), oldest, r.Retention)
	if r.RetainedFrom != nil {
		fmt.Fprintf(w, "; event times before %s dropped (%s)", r.RetainedFrom.Format(time.RFC3339), plural(r.PartitionsDropped, "partition"))
	}
	fmt.Fprintln(w)
}

// plural writes n things: 1 partition, 2 partitions.
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// fmtBytes writes a size for people: 512 B, 12.3 MiB.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Text describes the failure: "failing since <time> (<n> attempts, next
// attempt <time>): <error>", on one line.
func (f FailingPartition) Text() string {
	attempts := "attempts"
	if f.Attempts == 1 {
		attempts = "attempt"
	}
	next := "at the next run"
	if f.NextAttempt != nil {
		next = fmtTime(f.NextAttempt)
	}
	return fmt.Sprintf("failing since %s (%d %s, next attempt %s): %s",
		fmtTime(f.FailingSince), f.Attempts, attempts, next, strings.Join(strings.Fields(f.LastError), " "))
}

func fmtRatio(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", *f*100)
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func fmtInt(n *int64) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

func fmtReasons(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
