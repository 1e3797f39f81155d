package status

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

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
		if p := s.Paused; p != nil {
			fmt.Fprintf(tw, "  PAUSED\t%s; tidemark resume %s starts it again\n", p, s.Name)
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
	for _, r := range c.ShownResyncs() {
		fmt.Fprintf(w, "  %s\t%s\n", r.Label(), r.Text())
	}
	if more := c.MoreResyncs(); more > 0 {
		fmt.Fprintf(w, "    … and %d more pending\n", more)
	}
	writeRaw(w, s.Raw)
}

// maxResyncs is how many resyncs of a CDC source the text and the page
// list; the JSON has them all.
const maxResyncs = 10

// ShownResyncs are the resyncs the text and the page list: the first
// maxResyncs of those not done, and the last one done.
func (c *CDC) ShownResyncs() []Resync {
	var out []Resync
	for i, r := range c.Resyncs {
		if r.State == "done" || i < maxResyncs {
			out = append(out, r)
		}
	}
	return out
}

// MoreResyncs counts the resyncs not done that ShownResyncs leaves out.
func (c *CDC) MoreResyncs() int { return len(c.Resyncs) - len(c.ShownResyncs()) }

// Label names the resync in a list: "resync public.orders", "last resync
// public.orders" for one done.
func (r Resync) Label() string {
	if r.State == "done" {
		return "last resync " + r.Table
	}
	return "resync " + r.Table
}

// Text describes the resync and its progress on one line: "copying:
// 12000 of about 30000 rows (40.0%), 12 chunks, since <time>, 1500
// rows/s, about 12s left".
func (r Resync) Text() string {
	switch r.State {
	case "pending":
		return fmt.Sprintf("pending: asked for %s by %s", fmtTime(&r.RequestedAt), r.RequestedBy)
	case "done":
		took := "-"
		if r.StartedAt != nil && r.FinishedAt != nil {
			took = r.FinishedAt.Sub(*r.StartedAt).Round(time.Second).String()
		}
		return fmt.Sprintf("done %s: %s copied in %s%s, %d removed", fmtTime(r.FinishedAt), plural(r.RowsCopied, "row"), took, fmtRate(r.RowsPerSecond), r.RowsRemoved)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d", r.State, r.RowsCopied)
	if r.RowsPlanned != nil {
		fmt.Fprintf(&b, " of about %d rows", *r.RowsPlanned)
	} else {
		b.WriteString(" rows (the source has no estimate of the table's rows)")
	}
	if r.Percent != nil {
		fmt.Fprintf(&b, " (%.1f%%)", *r.Percent)
	}
	fmt.Fprintf(&b, ", %s, since %s%s", plural(r.Chunks, "chunk"), fmtTime(r.StartedAt), fmtRate(r.RowsPerSecond))
	if r.ETASeconds != nil {
		fmt.Fprintf(&b, ", about %s left", (time.Duration(*r.ETASeconds) * time.Second).Round(time.Second))
	}
	return b.String()
}

// fmtRate writes a rate of rows for people: ", 1500 rows/s"; nothing when
// there is none.
func fmtRate(r *float64) string {
	switch {
	case r == nil:
		return ""
	case *r >= 10:
		return fmt.Sprintf(", %.0f rows/s", *r)
	}
	return fmt.Sprintf(", %.1f rows/s", *r)
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
