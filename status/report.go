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
	"encoding/json"
	"io"
	"time"

	"github.com/tidemark-dev/tidemark/pause"
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
	// Paused is the source's pause (tidemark pause); nil while it runs.
	Paused *pause.Pause `json:"paused,omitempty"`
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
	// Resyncs are the source's resyncs not done (tidemark resync), in the
	// order the reader copies them, then the last one that ended.
	Resyncs []Resync `json:"resyncs"`
}

// Resync is the resync of one table of a CDC source, as
// tidemark.cdc_resyncs holds it, with its progress.
type Resync struct {
	Table      string `json:"table"`
	Generation int64  `json:"generation"`
	// State is pending (asked for), copying or done.
	State       string     `json:"state"`
	RequestedAt time.Time  `json:"requested_at"`
	RequestedBy string     `json:"requested_by"`
	StartedAt   *time.Time `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	Chunks      int64      `json:"chunks"`
	RowsCopied  int64      `json:"rows_copied"`
	// RowsPlanned is the source's estimate of the table's rows when the
	// copy began; null before, or when the source had none.
	RowsPlanned *int64 `json:"rows_planned"`
	RowsRemoved int64  `json:"rows_removed"`
	// Percent is RowsCopied of RowsPlanned: below 100 until the copy is
	// done (the estimate may fall short), 100 once it is; null without
	// an estimate while copying, and while pending.
	Percent *float64 `json:"percent"`
	// RowsPerSecond is the rows copied per second since the copy began,
	// until it ended for one done; null while pending.
	RowsPerSecond *float64 `json:"rows_per_second"`
	// ETASeconds is the time left at that rate while copying, when the
	// estimate is not yet reached.
	ETASeconds *float64 `json:"eta_seconds"`
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

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
