package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestShutdownLimit: a `run` whose shutdown cannot finish within the
// shutdown limit (here a batch is being written to a warehouse that has
// stopped answering, which the shutdown retries for up to 30 s) exits
// with status 1 once the limit passes, after logging why and every
// goroutine's stack, instead of waiting for whatever holds it.
func TestShutdownLimit(t *testing.T) {
	const group, topic = "tidemark-shutdown", "events"
	pool, dsn := pgtest.NewPool(t)
	proxied, px := faulttest.Front(t, dsn)
	kc := kafkatest.NewCluster(t, 1, topic)
	addr := freeAddr(t)
	cfgPath := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: %q}
kafka: {brokers: [%q], group: %s, session_timeout: 1s, rebalance_timeout: 2s}
ingest: {batch_max_age: 20ms}
sources:
  app_events:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
`, proxied, addr, kc.ListenAddrs()[0], group, topic))
	producer := kafkatest.Producer(t, kc)
	record := func(id string) *kgo.Record {
		return &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z"}`, id))}
	}
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	p := startWith(t, []string{envClock + "=" + now.Format(time.RFC3339), envShutdownLimit + "=2s"}, "run", "-c", cfgPath)
	kafkatest.Produce(t, producer, record("before"))
	waitfor.Until(t, "the first record to be stored", func() bool { return storedTotal(t, pool, group, topic) >= 1 })

	// Once the second record is in the batch, writing it hangs: at once,
	// or when the shutdown writes the batch in flight.
	px.Stall()
	kafkatest.Produce(t, producer, record("during"))
	waitfor.Until(t, "the second record to be read", func() bool {
		return metricValue(addr, `tidemark_ingest_records_consumed_total{source="app_events"}`) >= 2
	})
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("run did not exit within 20s of SIGTERM with a 2s shutdown limit:\n%s", p.output.String())
	}
	took := time.Since(sent)
	var exit *exec.ExitError
	if !errors.As(p.err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", p.err)
	}
	out := p.output.String()
	for _, want := range []string{"shutdown did not finish in time", "goroutine ", "kafka.(*Ingester)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if took < 2*time.Second || took > 10*time.Second {
		t.Errorf("exited %s after SIGTERM, want about the 2s limit", took.Round(100*time.Millisecond))
	}
	px.Resume()
}

// metricValue returns the value of series (a metric name with its labels,
// as /metrics writes them) that the service at addr reports, or -1 when
// it cannot be read.
func metricValue(addr, series string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(body), "\n") {
		if value, ok := strings.CutPrefix(line, series+" "); ok {
			if v, err := strconv.ParseFloat(value, 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// TestRunCancelledBeforeStart: a SIGTERM that arrives while run checks
// privileges, before the service starts, ends run with status 0 and no
// error, as at any other time; the check it cut short is no failure.
func TestRunCancelledBeforeStart(t *testing.T) {
	_, dsn := pgtest.NewPool(t)
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
sources:
  orders:
    table: {name: public.orders, key: [id], event_time: ts, ingested_at: loaded}
`, dsn))
	if code, _, stderr := invoke(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %d %s", code, stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"run", "-c", cfg}, &stdout, &stderr); code != exitOK || strings.Contains(stderr.String(), "error") {
		t.Errorf("run after SIGTERM before start: exit %d\n%s", code, stderr.String())
	}
}
