package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/history"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testenv"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
	"github.com/tidemark-dev/tidemark/service"
)

// pageConfig has one Kafka source with raw retention of 10 days and three
// aggregates over it: daily sales, hourly sales, and a daily aggregate
// whose SQL fails for 3 October, so that its partition stays queued and
// failing.
const pageConfig = `
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka: {brokers: [%q], group: page-test}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 60d
    watermark: {out_of_orderness: 1m}
    retention: {raw: 10d}
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date}
    lateness_horizon: 72h
    sql: SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS n FROM {{events}} GROUP BY 1
  hourly_sales:
    source: app_events
    table: hourly_sales
    partition: {by: hour, column: hour}
    lateness_horizon: 6h
    sql: SELECT {{partition}} AS hour, count(*) AS n FROM {{events}} GROUP BY 1
  daily_checked:
    source: app_events
    table: daily_checked
    partition: {by: day, column: day}
    lateness_horizon: 72h
    sql: |
      SELECT {{partition}} AS day, count(*) AS n,
             sum(1 / CASE WHEN {{partition}} = date '2026-10-03' THEN 0 ELSE 1 END) AS checked
      FROM {{events}} GROUP BY 1
`

// pageNow is the service clock when the page is loaded.
var pageNow = time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)

// TestStatusPageInBrowser loads the status page of a running service in
// headless Chromium, with two weeks of late sales behind it: partitions in
// every state (open, closed, final, archived by retention, queued and
// failing), a lateness chart and an arrival curve. It checks the grid, the
// charts and their numbers against the warehouse, and saves a PNG
// screenshot (TIDEMARK_ARTIFACTS, default the repository's artifacts/
// directory), whose pixels must show the bars, the horizon and the
// curve's points.
func TestStatusPageInBrowser(t *testing.T) {
	browser := findChromium(t)
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 2, "app-events")
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(pageConfig, dsn, kc.ListenAddrs()[0])), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.New(time.Date(2026, 9, 22, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	addr, _ := runService(t, cfg, service.Options{Registry: prometheus.NewRegistry(), Now: clk.Now, Only: []string{service.ComponentIngest}})
	loadHistory(t, ctx, cfg, pool, kc.ListenAddrs()[0], clk)

	url := "http://" + addr + "/"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1360, 1000), chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible("#grid")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	eval := func(js string, out any) {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[json.RawMessage](js))
		if err == nil {
			err = json.Unmarshal(v, out)
		}
		if err != nil {
			t.Fatalf("browser: %s: %v", js, err)
		}
	}
	var cells []map[string]string
	var lateness map[string]string
	var bars []int64
	var horizons, curves int
	var points []map[string]string
	eval(`Array.from(document.querySelectorAll('#grid td.cell')).map(c =>
		Object.assign({aggregate: c.closest('tr').dataset.aggregate, text: c.innerText}, c.dataset))`, &cells)
	eval(`Object.assign({}, document.querySelector('#aggregate-daily_sales svg.lateness').dataset)`, &lateness)
	eval(`Array.from(document.querySelectorAll('#aggregate-daily_sales svg.lateness rect.bar')).map(r => +r.dataset.count)`, &bars)
	eval(`document.querySelectorAll('#aggregate-daily_sales svg.lateness line.horizon').length`, &horizons)
	eval(`document.querySelectorAll('#aggregate-daily_sales svg.curve path.curve-line').length`, &curves)
	eval(`Array.from(document.querySelectorAll('#aggregate-daily_sales svg.curve g.partition')).map(g => Object.assign({}, g.dataset))`, &points)
	var window map[string]string
	eval(`Object.assign({}, document.querySelector('#aggregate-daily_sales figure.lateness').dataset)`, &window)
	// Where the grid and the charts are on the page, in screenshot pixels.
	rect := func(sel string) image.Rectangle {
		t.Helper()
		var r []float64
		eval(`(() => { const r = document.querySelector('`+sel+`').getBoundingClientRect(), d = devicePixelRatio;
			return [(r.left + scrollX) * d, (r.top + scrollY) * d, (r.right + scrollX) * d, (r.bottom + scrollY) * d]; })()`, &r)
		return image.Rect(int(r[0]), int(r[1]), int(r[2]), int(r[3]))
	}
	gridBox, latenessBox, curveBox := rect("#grid"), rect("#aggregate-daily_sales svg.lateness"), rect("#aggregate-daily_sales svg.curve")
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	saveArtifact(t, "status-page.png", shot)

	// The grid: every cell's state, completeness and rebuilds are the
	// warehouse's.
	type want struct {
		state, completeness string
		rebuilds, attempts  int64
		queued              bool
	}
	wantCells := map[string]want{}
	newest := map[string][]string{} // per aggregate, the labels of its 14 newest partitions
	rows, err := pool.Query(ctx, `
		SELECT a.aggregate, a.partition_start, coalesce(p.state, 'queued'), coalesce(p.completeness::text, ''), coalesce(p.rebuilds, 0),
		       q.aggregate IS NOT NULL, coalesce(q.attempts, 0)
		FROM (SELECT aggregate, partition_start FROM tidemark.partitions UNION SELECT aggregate, partition_start FROM tidemark.pending_partitions) a
		LEFT JOIN tidemark.partitions p USING (aggregate, partition_start)
		LEFT JOIN tidemark.pending_partitions q USING (aggregate, partition_start)
		ORDER BY a.aggregate, a.partition_start DESC`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var agg string
		var start time.Time
		var w want
		if err := rows.Scan(&agg, &start, &w.state, &w.completeness, &w.rebuilds, &w.queued, &w.attempts); err != nil {
			t.Fatal(err)
		}
		d, err := aggregate.FromConfig(cfg, agg)
		if err != nil {
			t.Fatal(err)
		}
		key := d.Calendar.At(start).Label()
		wantCells[agg+" "+key] = w
		if len(newest[agg]) < 14 {
			newest[agg] = append([]string{key}, newest[agg]...)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for _, c := range cells {
		k := c["aggregate"] + " " + c["partition"]
		w, ok := wantCells[k]
		if !ok {
			t.Errorf("grid cell %s is not in the warehouse", k)
			continue
		}
		states[c["state"]]++
		if c["failedAttempts"] != "0" {
			states["failing"]++
		}
		if c["state"] != w.state || c["rebuilds"] != fmt.Sprint(w.rebuilds) || c["queued"] != fmt.Sprint(w.queued) ||
			c["failedAttempts"] != fmt.Sprint(w.attempts) {
			t.Errorf("grid cell %s: state %s, %s rebuilds, queued %s, %s failed attempts; the warehouse has %+v",
				k, c["state"], c["rebuilds"], c["queued"], c["failedAttempts"], w)
		}
		if !sameFloat(c["completeness"], w.completeness) {
			t.Errorf("grid cell %s: completeness %q, the warehouse has %q", k, c["completeness"], w.completeness)
		}
	}
	for _, s := range []string{"open", "closed", "final", "archived", "queued", "failing"} {
		if states[s] == 0 {
			t.Errorf("no grid cell is %s; states shown: %v", s, states)
		}
	}
	shown := map[string][]string{}
	for _, c := range cells {
		shown[c["aggregate"]] = append(shown[c["aggregate"]], c["partition"])
	}
	for _, agg := range cfg.AggregateNames() {
		if !slices.Equal(shown[agg], newest[agg]) || len(shown[agg]) != 14 {
			t.Errorf("grid row %s shows %v, want the 14 newest partitions, oldest first: %v", agg, shown[agg], newest[agg])
		}
	}

	// The lateness chart of daily_sales: the events of the 7 days of event
	// time before the longest horizon (72h) ended, those beyond the 72h
	// horizon, one bar per bin.
	until := pageNow.Add(-72 * time.Hour)
	if window["since"] != until.Add(-7*24*time.Hour).Format(time.RFC3339) || window["until"] != until.Format(time.RFC3339) {
		t.Errorf("lateness window %v, want the 7 days before %s", window, until.Format(time.RFC3339))
	}
	var events, beyond int64
	err = pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE ingested_at > date_trunc('day', event_time AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day 72 hours')
		FROM raw.app_events WHERE event_time >= $1 AND event_time < $2`, until.Add(-7*24*time.Hour), until).Scan(&events, &beyond)
	if err != nil {
		t.Fatal(err)
	}
	if lateness["events"] != fmt.Sprint(events) || lateness["beyond"] != fmt.Sprint(beyond) || lateness["horizonSeconds"] != "259200" {
		t.Errorf("lateness chart: %v; the warehouse has %d events, %d beyond the 72h horizon", lateness, events, beyond)
	}
	if beyond == 0 || events < 50 {
		t.Errorf("the workload should give events beyond the horizon: %d of %d", beyond, events)
	}
	var sum int64
	for _, n := range bars {
		sum += n
	}
	if sum != events || horizons != 1 {
		t.Errorf("lateness chart: bars hold %d events of %d; %d horizon lines", sum, events, horizons)
	}

	// The arrival curve, and on it the partitions that are not final at
	// the completeness the reconciler stored.
	if curves != 1 || len(points) < 2 {
		t.Errorf("arrival curve: %d lines, %d partitions placed on it", curves, len(points))
	}
	for _, p := range points {
		w := wantCells["daily_sales "+p["partition"]]
		if w.state == "final" || !sameFloat(p["completeness"], w.completeness) {
			t.Errorf("curve point %s: completeness %s; the warehouse has %+v", p["partition"], p["completeness"], w)
		}
	}

	// The screenshot shows the bars, the horizon, the beyond bars and the
	// curve's points in their colours.
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	for _, c := range []struct {
		name string
		box  image.Rectangle
		rgb  [3]uint8
	}{
		{"bars within the horizon", latenessBox, [3]uint8{0x3b, 0x82, 0xf6}},
		{"bars beyond it", latenessBox, [3]uint8{0xdc, 0x26, 0x26}},
		{"the horizon line", latenessBox, [3]uint8{0xb4, 0x23, 0x18}},
		{"the curve", curveBox, [3]uint8{0x25, 0x63, 0xeb}},
		{"the curve's horizon", curveBox, [3]uint8{0xb4, 0x23, 0x18}},
		{"partitions on the curve", curveBox, [3]uint8{0xd9, 0x77, 0x06}},
		{"open cells", gridBox, [3]uint8{0xdb, 0xea, 0xfe}},
		{"closed cells", gridBox, [3]uint8{0xfd, 0xe6, 0x8a}},
		{"final cells", gridBox, [3]uint8{0xbb, 0xf7, 0xd0}},
		{"archived cells", gridBox, [3]uint8{0xe5, 0xe7, 0xeb}},
	} {
		if n := countColour(img, c.box, c.rgb); n < 20 {
			t.Errorf("the screenshot shows %d pixels of %s (#%02x%02x%02x) in %v", n, c.name, c.rgb[0], c.rgb[1], c.rgb[2], c.box)
		}
	}
}

// loadHistory produces two weeks of late sales through Kafka with the
// service clock at each batch's arrival, reconciles every aggregate each
// simulated day and at pageNow, and prunes with the 10-day raw retention.
func loadHistory(t *testing.T, ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, broker string, clk *clock.Settable) {
	t.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ProducerLinger(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	rec, err := reconcile.New(cfg, pool, reconcile.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	reconcileAll := func() {
		t.Helper()
		for _, name := range cfg.AggregateNames() {
			if _, err := rec.RunOnce(ctx, name, true); err != nil && name != "daily_checked" {
				t.Fatalf("reconcile %s: %v", name, err)
			}
		}
	}
	evs := history.Sales("s", time.Date(2026, 9, 22, 0, 0, 0, 0, time.UTC), pageNow, pageNow, 12)
	lastDay := clk.Now().Truncate(24 * time.Hour)
	produced := 0
	for _, batch := range history.Batches(evs) {
		if day := batch[0].Arrives.Truncate(24 * time.Hour); day.After(lastDay) {
			clk.Set(day)
			reconcileAll()
			lastDay = day
		}
		clk.Set(batch[0].Arrives)
		recs := make([]*kgo.Record, len(batch))
		for i, e := range batch {
			recs[i] = &kgo.Record{Topic: "app-events", Key: []byte(e.ID), Value: e.JSON()}
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		produced += len(recs)
		waitRows(t, ctx, pool, produced)
	}
	clk.Set(pageNow)
	reconcileAll()
	reconcileAll()
	pr, err := retention.New(cfg, pool, retention.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Run(ctx, false); err != nil {
		t.Fatalf("prune: %v", err)
	}
}

// waitRows waits until the raw table holds n rows.
func waitRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) {
	t.Helper()
	var got int
	if waitfor.Poll(waitfor.Timeout, func() bool {
		if err := pool.QueryRow(ctx, "SELECT coalesce(sum(rows_written), 0) FROM tidemark.kafka_offsets").Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got >= n
	}) != nil {
		t.Fatalf("%d of %d events ingested after %s", got, n, waitfor.Timeout)
	}
}

// findChromium returns the browser to drive: $CHROMIUM, or chromium or
// google-chrome on the PATH. Without one the test skips, unless
// TIDEMARK_REQUIRE_CHROMIUM is set (as in CI), when it fails.
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "CHROMIUM", "no chromium on the PATH (apt-get install chromium)")
	return ""
}

// saveArtifact writes data to $TIDEMARK_ARTIFACTS/name, by default to the
// repository's artifacts/ directory.
func saveArtifact(t *testing.T, name string, data []byte) {
	t.Helper()
	dir := os.Getenv("TIDEMARK_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "..", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(path)
	t.Logf("screenshot: %s (%d bytes)", abs, len(data))
}

// sameFloat compares two decimal renderings of a float, "" for none.
func sameFloat(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	x, errA := strconv.ParseFloat(a, 64)
	y, errB := strconv.ParseFloat(b, 64)
	return errA == nil && errB == nil && math.Abs(x-y) < 1e-9
}

// countColour counts the pixels of img in box within a small distance of
// rgb.
func countColour(img image.Image, box image.Rectangle, rgb [3]uint8) int {
	n := 0
	b := img.Bounds().Intersect(box)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r>>8, rgb[0]) && near(g>>8, rgb[1]) && near(bl>>8, rgb[2]) {
				n++
			}
		}
	}
	return n
}

func near(v uint32, want uint8) bool { return math.Abs(float64(v)-float64(want)) <= 6 }
