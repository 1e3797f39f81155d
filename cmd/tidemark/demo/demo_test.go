package demo

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/history"
)

// TestDemo runs `make demo` in-process and checks what it shows, so that
// the README's first command keeps working.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, &out, Options{}); err != nil {
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
		t.Logf("demo output:\n%s", text)
	}
}
