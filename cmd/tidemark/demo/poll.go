package demo

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/mirror"
)

// sourceDDL is the worked example's source table, in a second database
// that plays the application's own PostgreSQL.
const sourceDDL = `CREATE TABLE src_customers (
    customer_id bigint PRIMARY KEY,
    email       text NOT NULL,
    tier        text NOT NULL,
    updated_at  timestamptz NOT NULL
)`

// pollPart loads the worked example's customers table by updated_at
// watermark, the way `tidemark poll --once --upper T [--lookback D]` does,
// and finds a hard delete by key reconciliation.
func (d *run) pollPart(cfg *config.Config, src *pgxpool.Pool) error {
	fmt.Fprintln(d.out, "Part 2: a table of the application's database (customers), loaded by its updated_at watermark into")
	fmt.Fprintln(d.out, "the mirror dw_customers; each step is one `tidemark poll --once --source customers --upper T`:")
	pc, err := poll.ConfigFrom(cfg, "customers")
	if err != nil {
		return err
	}
	p, err := poll.New(pc, d.pool, poll.Options{Now: d.clk.Now})
	if err != nil {
		return err
	}
	defer p.Close()
	if _, err := src.Exec(d.ctx, sourceDDL); err != nil {
		return err
	}
	lookback := 30 * time.Minute
	steps := []struct {
		what     string
		sql      string
		upper    string
		lookback *time.Duration
	}{
		{"customers 1 (09:00) and 2 (09:30) are written", `INSERT INTO src_customers VALUES
			(1, 'ana@example.com', 'free', '2026-10-05 09:00+00'), (2, 'ben@example.com', 'pro', '2026-10-05 09:30+00')`,
			"2026-10-05 10:00", nil},
		{"the same run again (a retry) changes nothing", "", "2026-10-05 10:00", nil},
		{"customer 1 upgrades at 10:15, customer 3 signs up at 10:20", `
			UPDATE src_customers SET tier = 'pro', updated_at = '2026-10-05 10:15+00' WHERE customer_id = 1;
			INSERT INTO src_customers VALUES (3, 'cy@example.com', 'free', '2026-10-05 10:20+00')`, "2026-10-05 11:00", nil},
		{"customer 4, stamped 10:10, commits only now (after the watermark passed 10:20)",
			`INSERT INTO src_customers VALUES (4, 'dee@example.com', 'free', '2026-10-05 10:10+00')`, "2026-10-05 12:00", nil},
		{"the same window with --lookback 30m", "", "2026-10-05 12:00", &lookback},
	}
	for _, s := range steps {
		if s.sql != "" {
			if _, err := src.Exec(d.ctx, s.sql); err != nil {
				return err
			}
		}
		rep, err := p.RunOnce(d.ctx, poll.Window{Upper: at(s.upper), Lookback: s.lookback})
		if err != nil {
			return err
		}
		fmt.Fprintf(d.out, "  %s\n", s.what)
		flag := ""
		if s.lookback != nil {
			flag = " --lookback 30m"
		}
		fmt.Fprintf(d.out, "      poll --upper %q%s: read %d, merged %d (%d inserted, %d updated), watermark %s\n",
			s.upper+"+00", flag, rep.Read, rep.Merged, rep.Inserted, rep.Updated, rep.Watermark.UTC().Format("2006-01-02 15:04"))
	}
	fmt.Fprintln(d.out)
	if err := d.table("dw_customers: the mirror (customer 4 was missed without the lookback and loaded with it)", `
SELECT customer_id, tier, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS updated_at
FROM dw_customers ORDER BY customer_id`); err != nil {
		return err
	}

	// A hard delete leaves no updated_at behind: key reconciliation
	// compares the key sets, range by range, and finds it.
	if _, err := src.Exec(d.ctx, "DELETE FROM src_customers WHERE customer_id = 2"); err != nil {
		return err
	}
	d.clk.Set(at("2026-10-05 12:30"))
	fmt.Fprintln(d.out, "  [2026-10-05 12:30] customer 2 is deleted at the source (a hard delete: no updated_at to find)")
	k, err := mirror.NewKeyReconciler(p.Mirror(), cfg.Sources["customers"].Poll.DSN, d.pool, mirror.KeyOptions{Now: d.clk.Now})
	if err != nil {
		return err
	}
	for _, dry := range []bool{true, false} {
		rep, err := k.Run(d.ctx, dry)
		if err != nil {
			return err
		}
		cmd, result := "keys --dry-run", "nothing changed"
		if !dry {
			cmd, result = "keys", fmt.Sprintf("%d flagged with deleted_at", rep.Applied)
		}
		fmt.Fprintf(d.out, "      %s: %d source keys, %d mirror keys, %d ranges compared; missing at the source: %s (%s)\n",
			cmd, rep.SourceKeys, rep.MirrorKeys, rep.RangesCompared, strings.Join(rep.MissingAtSource, ", "), result)
	}
	fmt.Fprintln(d.out)
	return d.table("dw_customers after key reconciliation (deletes: soft keeps the row for history)", `
SELECT customer_id, tier, to_char(deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS deleted_at
FROM dw_customers ORDER BY customer_id`)
}
