package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/service"
)

// cmdCheck runs the checks a CDC reader runs at start, on every CDC
// source of the configuration (or --source), and says how each source's
// slot would fare in a failover of the source. It changes nothing.
func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("check", stderr)
	only := fs.String("source", "", "check only this CDC source")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	var names []string
	for _, name := range cfg.SourceNames() {
		if cfg.Sources[name].Kind() == config.KindCDC && (*only == "" || name == *only) {
			names = append(names, name)
		}
	}
	if *only != "" && len(names) == 0 {
		fmt.Fprintf(stderr, "tidemark check: --source: %q is not a CDC source of the configuration\n", *only)
		return exitUsage
	}
	if len(names) == 0 {
		fmt.Fprintln(stdout, "no CDC source to check")
		return exitOK
	}
	var wh *pgxpool.Pool
	if pool, err := service.Pool(ctx, cfg, "tidemark-check"); err != nil {
		fmt.Fprintf(stdout, "warehouse: %v: a missing slot is not compared with the position tidemark stored\n", err)
	} else {
		defer pool.Close()
		wh = pool
	}
	code := exitOK
	for _, name := range names {
		in := cdc.Inspection{Source: name}
		cc, err := cdc.ConfigFrom(cfg, name)
		if err != nil {
			in.Err = err
		} else {
			in = cdc.Inspect(ctx, cc, wh)
		}
		writeInspection(stdout, in, cc.Slot)
		if in.Err != nil {
			code = exitFailure
		}
	}
	return code
}

// writeInspection prints what tidemark check found of one source.
func writeInspection(w io.Writer, in cdc.Inspection, slot string) {
	r := in.Report
	fmt.Fprintf(w, "source %s\n", in.Source)
	if r.ServerVersion != 0 {
		role := "primary"
		if r.InRecovery {
			role = "standby"
		}
		fmt.Fprintf(w, "  server: PostgreSQL %d.%d, %s, system identifier %s\n", r.ServerVersion/10000, r.ServerVersion%10000, role, r.SystemID)
	}
	switch s := r.Slot; {
	case r.ServerVersion == 0:
	case !s.Exists:
		fmt.Fprintf(w, "  slot %s: does not exist (the reader creates it)\n", slot)
	default:
		var what []string
		if s.Failover {
			what = append(what, "failover slot")
		}
		if s.Synced {
			what = append(what, "synced from the primary")
		}
		what = append(what, "confirmed "+s.ConfirmedFlush.String())
		if s.WALStatus != "" {
			what = append(what, "wal_status "+s.WALStatus)
		}
		if s.Active {
			what = append(what, "active")
		}
		fmt.Fprintf(w, "  slot %s: %s\n", slot, strings.Join(what, ", "))
	}
	if r.ServerVersion >= 170000 && !r.InRecovery {
		standbys := r.StandbySlots
		if standbys == "" {
			standbys = "(not set)"
		}
		fmt.Fprintf(w, "  synchronized_standby_slots: %s\n", standbys)
	}
	if in.Position != 0 {
		fmt.Fprintf(w, "  stored position: %s\n", in.Position)
	}
	if in.Snapshot == "resync" {
		fmt.Fprintf(w, "  new slot asked for (tidemark resync --new-slot): the reader replaces the slot as it starts and resyncs every table\n")
	}
	switch st := in.Standby; {
	case in.StandbyErr != nil:
		fmt.Fprintf(w, "  standby: %v\n", in.StandbyErr)
	case st != nil && st.Exists:
		behind := ""
		if r.Slot.Exists && r.Slot.ConfirmedFlush >= st.Confirmed {
			behind = fmt.Sprintf(" (%d bytes behind the source's)", uint64(r.Slot.ConfirmedFlush-st.Confirmed))
		}
		fmt.Fprintf(w, "  standby: copy of the slot, synced %t, confirmed %s%s, replayed %s\n", st.Synced, st.Confirmed, behind, st.Replayed)
	case st != nil:
		fmt.Fprintf(w, "  standby: no copy of the slot, replayed %s\n", st.Replayed)
	}
	for _, warning := range r.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", warning)
	}
	for _, note := range in.Notes {
		fmt.Fprintf(w, "  failover: %s\n", note)
	}
	if in.Err != nil {
		fmt.Fprintf(w, "  problem: %v\n", in.Err)
		return
	}
	fmt.Fprintln(w, "  ok")
}
