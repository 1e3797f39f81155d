package main

import "strings"

// A commandSynopsis is one command's synopsis: its lines as docs/commands.md
// shows them (a continuation line indented under the first's flags), and
// what the command does, for the usage text.
type commandSynopsis struct {
	lines   []string
	summary string
}

// synopses are the commands as tidemark help lists them. The usage text
// is made from them, and a docs test holds the synopsis of
// docs/commands.md to their lines.
var synopses = []commandSynopsis{
	{[]string{"tidemark run       [-c FILE] [--only ingest,poll,cdc,reconcile,prune]"}, "run the service until SIGINT/SIGTERM"},
	{[]string{"tidemark migrate   [-c FILE]"}, "apply the warehouse schema migrations"},
	{[]string{"tidemark reconcile --once [-c FILE] [--aggregate NAME]"}, "reconcile aggregates once (for cron)"},
	{[]string{"tidemark backfill  --aggregate NAME --from D --to D [-c FILE] [--chunk 1d] [--concurrency N]",
		"                   [--reprocess missing|failed|completed] [--dry-run] [--shadow | --publish] [--force]"},
		"rebuild a range of partitions in chunks"},
	{[]string{"tidemark verify    --aggregate NAME [-c FILE] [--from D --to D]"}, "compare partitions with a rebuild; exit 1 on drift"},
	{[]string{"tidemark refresh   --aggregate NAME --full [-c FILE] [--chunk 1d] [--concurrency N] [--dry-run]"}, "rebuild every partition of the raw table"},
	{[]string{"tidemark poll      --once --source NAME [-c FILE] [--upper T] [--lookback D]"}, "load one timestamp-watermark window"},
	{[]string{"tidemark keys      --source NAME [-c FILE] [--dry-run] [--force]"}, "find rows deleted at the source (key reconciliation)"},
	{[]string{"tidemark prune     [-c FILE] [--dry-run]"}, "remove what retention no longer keeps"},
	{[]string{"tidemark forget    --aggregate NAME [-c FILE] [--dry-run]"}, "remove the state of an aggregate no longer configured"},
	{[]string{"tidemark dead-letters list [-c FILE] [--source NAME]"}, "count dead letters by source and reason"},
	{[]string{"tidemark dead-letters replay --source NAME [-c FILE] [--reason R] [--since T] [--dry-run]"}, "load the dead letters that decode with the configuration now"},
	{[]string{"tidemark pause     SOURCE [-c FILE] [--reason TEXT]"}, "stop reading a source on every instance"},
	{[]string{"tidemark resume    SOURCE [-c FILE]"}, "read a paused source again"},
	{[]string{"tidemark resync    SOURCE [TABLE...] [-c FILE] [--dry-run | --wait] [--new-slot]"}, "copy CDC tables again while they stream"},
	{[]string{"tidemark unpublish SOURCE [TABLE...] [-c FILE] [--dry-run]"}, "drop tables cdc.tables no longer names from the publication"},
	{[]string{"tidemark status    [-c FILE] [--json]"}, "offsets, lag, watermarks, partitions"},
	{[]string{"tidemark check     [-c FILE] [--source NAME]"}, "check CDC sources and their slots' failover; exit 1 on a problem"},
	{[]string{"tidemark lateness  --source NAME [-c FILE] [--since 30d] [--until T] [--target 99.9%] [--timeout 10m] [--json]"}, "how late events arrive; the horizon that keeps a target share"},
	{[]string{"tidemark grants    [-c FILE] [--migration-role R] [--runtime-role R] [--poll-role R] [--cdc-role R]"}, "print the SQL of least-privilege database roles"},
	{[]string{"tidemark demo      [-v] [--serve] [--citus]"}, "run a self-contained demonstration"},
	{[]string{"tidemark version"}, "print the version"},
	{[]string{"tidemark help"}, "print this text"},
}

// summaryColumn is where the usage text puts a command's summary: after
// its synopsis when that is shorter, else on a line of its own.
const summaryColumn = 58

// usage is what tidemark help prints, and what a usage error prints
// after its message.
var usage = usageText()

// usageText makes the usage text from synopses.
func usageText() string {
	var b strings.Builder
	b.WriteString("tidemark: load Kafka events and PostgreSQL tables into a PostgreSQL warehouse.\n\nUsage:\n")
	for _, s := range synopses {
		for i, l := range s.lines {
			line := "  " + l
			if i == len(s.lines)-1 && len(line) < summaryColumn-1 {
				b.WriteString(line + strings.Repeat(" ", summaryColumn-len(line)) + s.summary + "\n")
				continue
			}
			b.WriteString(line + "\n")
			if i == len(s.lines)-1 {
				b.WriteString(strings.Repeat(" ", summaryColumn) + s.summary + "\n")
			}
		}
	}
	b.WriteString("\nThe configuration file defaults to $TIDEMARK_CONFIG, then tidemark.yaml.\n" +
		"Exit codes: 0 success, 1 failure, 2 bad usage or configuration.\n")
	return b.String()
}
