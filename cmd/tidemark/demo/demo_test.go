package demo

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/history"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestDemo runs `make demo` in-process and checks what it shows, so that
// the README's first command keeps working.
func TestDemo(t *testing.T) {
	text := runDemo(t, Options{})
	if strings.Contains(text, "on Citus") {
		t.Errorf("the demo on one server shows a Citus part:\n%s", text)
	}
}

// TestCitusDemo runs `tidemark demo --citus`: the same story, on a Citus
// cluster, with the raw events spread over both workers, the CDC mirror
// distributed, and tidemark's own tables, the poll mirror and the
// aggregate on the coordinator.
func TestCitusDemo(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	pgtest.RequireCitus(t)
	text := runDemo(t, Options{Citus: true})
	rows := 4 + len(history.Sales("h", historyFrom, historyTo, historyNow, 12))
	perWorker := regexp.MustCompile(`(?m)^\s+worker ([12])\s+(\d+)\s+\d+$`).FindAllStringSubmatch(text, -1)
	sum := 0
	for _, m := range perWorker {
		n, _ := strconv.Atoi(m[2])
		if n == 0 {
			t.Errorf("worker %s holds no raw events", m[1])
		}
		sum += n
	}
	if len(perWorker) != 2 || sum != rows {
		t.Errorf("the raw events per worker are %v, want two workers holding %d in all", perWorker, rows)
	}
	if want := "the warehouse: the coordinator's postgres database, with the citus extension and 2 workers"; !strings.Contains(text, want) {
		t.Errorf("demo output lacks %q", want)
	}
	for table, placement := range map[string]string{
		"raw.app_events": "distributed", "raw.customers": "on the coordinator", "raw.shop": "distributed",
		"dw_orders": "distributed", "dw_customers": "on the coordinator",
		"daily_sales": "on the coordinator", "tidemark.ingest_ledger": "on the coordinator", "tidemark.kafka_offsets": "on the coordinator",
	} {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(table) + `\s+` + placement + `$`).MatchString(text) {
			t.Errorf("demo output does not show %s %s", table, placement)
		}
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", text)
	}
}

// runDemo runs the demonstration with opts, checks the story it tells,
// the same on one server and on Citus, and returns its output.
func runDemo(t *testing.T, opts Options) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, &out, opts); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	text := out.String()
	rows := 4 + len(history.Sales("h", historyFrom, historyTo, historyNow, 12))
	for _, want := range []string{
		fmt.Sprintf(`tidemark_ingest_rows_written_total{source="app_events"} %d`, rows),
		// The open partition's completeness, from the history's final days.
		"completeness of the daily_sales partitions that are not final",
		"2026-10-05  open     45.5% complete: 45.5% of a final day's events had arrived 14h before its end",
		"2026-10-04  closed   90.9% complete",
		// The lateness of the source, with a recommended horizon.
		"aggregate daily_sales (day in UTC, lateness_horizon 72h): delay after the end of the event's partition:",
		"smallest horizon keeping 99.9%  84h (lateness_horizon: 84h)",
		// e3 happened on 4 October and arrived 9h45m later, on the 5th.
		"e3        2026-10-04 23:30  2026-10-05 09:15  09:45:00",
		"app_events_p20261004", "app_events_p20261005",
		"missing_id", "invalid_json", "time_out_of_range",
		"duplicates dropped    1",
		"event-time watermark  2026-10-05T08:00:00Z",
		"reconcile: rebuilt 2026-10-04 (load watermark",
		"2026-10-04  15.00   2", "2026-10-05  20.00   1",
		"2026-10-04  closed  1     2",
		"e0|2026-10-01 12:00:00+00",
		"poll --upper \"2026-10-05 12:00+00\": read 0, merged 0",
		"poll --upper \"2026-10-05 12:00+00\" --lookback 30m: read 3, merged 1 (1 inserted, 0 updated), watermark 2026-10-05 10:20",
		"4            free  2026-10-05 10:10",
		"keys --dry-run: 3 source keys, 4 mirror keys",
		"missing at the source: 2 (1 flagged with deleted_at)",
		"2            pro   2026-10-05 12:30",
		"order 2 is deleted at the source (a hard delete, which no updated_at would show)\n      raw change rows so far: 3",
		"  1         paid    20.00", "  3         paid    12.00",
		"delete  public.orders  2        placed  true",
		"source shop (cdc: slot tidemark_shop, orders)",
		"transactions / changes      3 / 4",
		"done: the service committed its last batch",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatalf("demo output:\n%s", text)
	}
	return text
}
