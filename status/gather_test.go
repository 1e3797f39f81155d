package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// resyncEnv is a migrated warehouse and a configuration with the CDC
// sources shop and empty.
type resyncEnv struct {
	t   *testing.T
	wh  *pgxpool.Pool
	cfg *config.Config
}

func newResyncEnv(t *testing.T) *resyncEnv {
	t.Helper()
	wh, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", fmt.Appendf(nil, `warehouse: {dsn: %q}
sources:
  shop:
    cdc: {dsn: "postgres://u@127.0.0.1:1/shop", tables: [orders, items, notes, lines]}
    mirror: {schema: shop}
  empty:
    cdc: {dsn: "postgres://u@127.0.0.1:1/empty", tables: [orders]}
    mirror: {table: dw_empty}
`, dsn), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return &resyncEnv{t: t, wh: wh, cfg: cfg}
}

// resync stores a resync of table of source in state, requested at
// requested, started and finished that long before now when not zero.
func (e *resyncEnv) resync(source, table, state string, requested, started, finished time.Time, copied int64, planned *int64) {
	e.t.Helper()
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	if _, err := e.wh.Exec(e.t.Context(), `INSERT INTO tidemark.cdc_resyncs
(source, source_table, generation, state, requested_at, requested_by, started_at, finished_at, chunks, rows_copied, rows_removed, rows_planned)
VALUES ($1, $2, 1, $3, $4, 'alice', $5, $6, $7 / 1000, $7, 3, $8)`, source, table, state, requested, at(started), at(finished), copied, planned); err != nil {
		e.t.Fatal(err)
	}
}

// TestResyncStatus: the report of a CDC source lists the resync being
// copied with its rows copied of those planned, percent, rate and time
// left, then those pending in the order the reader takes them, then the
// last one done; the text, the JSON and the page show them.
func TestResyncStatus(t *testing.T) {
	e := newResyncEnv(t)
	now := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	planned := func(n int64) *int64 { return &n }
	e.resync("shop", "public.notes", "done", now.Add(-3*time.Hour), now.Add(-3*time.Hour), now.Add(-2*time.Hour), 1000, planned(900))
	e.resync("shop", "public.lines", "done", now.Add(-2*time.Hour), now.Add(-2*time.Hour), now.Add(-time.Hour), 20000, planned(20000))
	e.resync("shop", "public.items", "pending", now.Add(-time.Minute), time.Time{}, time.Time{}, 0, nil)
	e.resync("shop", "public.orders", "copying", now.Add(-20*time.Second), now.Add(-10*time.Second), time.Time{}, 12000, planned(30000))

	rep, err := Gather(t.Context(), e.wh, e.cfg, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*CDC{}
	for _, s := range rep.Sources {
		byName[s.Name] = s.CDC
	}
	got := byName["shop"].Resyncs
	f := func(p *float64) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprintf("%.1f", *p)
	}
	// table state copied/planned percent rate eta
	var lines []string
	for _, r := range got {
		lines = append(lines, fmt.Sprintf("%s %s %d/%v %s %s %s", r.Table, r.State, r.RowsCopied, fmtInt(r.RowsPlanned), f(r.Percent), f(r.RowsPerSecond), f(r.ETASeconds)))
	}
	want := []string{
		"public.orders copying 12000/30000 40.0 1200.0 15.0",
		"public.items pending 0/- nil nil nil",
		"public.lines done 20000/20000 100.0 5.6 nil",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("resyncs:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if r := byName["empty"].Resyncs; r == nil || len(r) != 0 {
		t.Errorf("a source without resyncs has %#v, want an empty list", r)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(text.String()), " ")
	for _, want := range []string{
		"resync public.orders copying: 12000 of about 30000 rows (40.0%), 12 chunks, since 2026-12-07T14:59:50Z, 1200 rows/s, about 15s left",
		"resync public.items pending: asked for 2026-12-07T14:59:00Z by alice",
		"last resync public.lines done 2026-12-07T14:00:00Z: 20000 rows copied in 1h0m0s, 5.6 rows/s, 3 removed",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("status text lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(flat, "public.notes") {
		t.Errorf("status text shows a resync before the last one done:\n%s", text.String())
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if r := back.Sources[1].CDC.Resyncs; len(r) != 3 || r[0].Percent == nil || *r[0].Percent != 40 || *r[0].RowsPlanned != 30000 ||
		r[0].StartedAt == nil || !r[0].StartedAt.Equal(now.Add(-10*time.Second)) {
		t.Errorf("status JSON of shop's resyncs: %s", js.String())
	}

	p := &Page{Report: rep, Lateness: map[string]*lateness.Report{}, LatenessError: map[string]string{},
		Curves: map[string]*lateness.ArrivalCurve{}, CurveError: map[string]string{}, Slots: map[string]cdc.SlotReading{}}
	var html strings.Builder
	if err := p.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html.String(), "%!") {
		t.Errorf("the page holds a formatting error:\n%s", html.String())
	}
	for _, want := range []string{
		`<li data-resync="shop public.orders"><b>shop</b>: resync of public.orders copying, 40.0%; 1 more pending</li>`,
		`<tr data-resync="public.orders"><th>resync public.orders</th><td><progress class="resync" max="100" value="40.0"></progress> copying: 12000 of about 30000 rows (40.0%)`,
		`<tr data-resync="public.items"><th>resync public.items</th><td>pending: asked for 2026-12-07T14:59:00Z by alice</td></tr>`,
		`<tr data-resync="public.lines"><th>last resync public.lines</th><td>done 2026-12-07T14:00:00Z`,
	} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %s\n%s", want, html.String())
		}
	}
}

// TestResyncStatusEdges: a copy without an estimate shows its rows and
// rate but no percent; one past its estimate stays below 100% until it is
// done; a long list is cut in the text with the number left out.
func TestResyncStatusEdges(t *testing.T) {
	e := newResyncEnv(t)
	now := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	over := int64(1000)
	e.resync("shop", "public.orders", "copying", now.Add(-time.Minute), now.Add(-10*time.Second), time.Time{}, 5000, nil)
	e.resync("empty", "public.orders", "copying", now.Add(-time.Minute), now.Add(-10*time.Second), time.Time{}, 5000, &over)
	for i := range maxResyncs + 2 {
		e.resync("shop", fmt.Sprintf("public.t%02d", i), "pending", now.Add(time.Duration(i)*time.Second-30*time.Second), time.Time{}, time.Time{}, 0, nil)
	}
	rep, err := Gather(context.Background(), e.wh, e.cfg, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	empty, shop := rep.Sources[0].CDC.Resyncs, rep.Sources[1].CDC.Resyncs
	if r := shop[0]; r.Table != "public.orders" || r.Percent != nil || r.ETASeconds != nil || r.RowsPerSecond == nil || *r.RowsPerSecond != 500 {
		t.Errorf("a copy without an estimate: %+v", r)
	}
	if r := empty[0]; r.Percent == nil || *r.Percent != 99.9 || r.ETASeconds != nil {
		t.Errorf("a copy past its estimate: %+v", r)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(text.String()), " ")
	for _, want := range []string{
		"resync public.orders copying: 5000 rows (the source has no estimate of the table's rows), 5 chunks, since 2026-12-07T14:59:50Z, 500 rows/s",
		"resync public.t08 pending",
		"… and 3 more pending",
		"resync public.orders copying: 5000 of about 1000 rows (99.9%)",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("status text lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(flat, "public.t09") {
		t.Errorf("status text lists more than %d resyncs of a source:\n%s", maxResyncs, text.String())
	}
}
