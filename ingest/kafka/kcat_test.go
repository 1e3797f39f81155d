package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testenv"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestKcatInterop is acceptance item 5: records produced by kcat, an
// independent Kafka client (librdkafka), are ingested. The test is skipped
// when kcat is not installed, unless TIDEMARK_REQUIRE_KCAT is set (CI sets
// it, after installing kcat).
func TestKcatInterop(t *testing.T) {
	pgtest.ServerIndependent(t)
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		testenv.Missing(t, "KCAT", "kcat is not installed (apt-get install kcat)")
	}
	b := setup(t, 2)
	want := map[string]bool{}
	var input strings.Builder
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("kcat-%d", i)
		want[id] = true
		ts := testNow.Add(-time.Duration(i) * time.Minute).Format(time.RFC3339)
		fmt.Fprintf(&input, "%s|{\"event_id\":%q,\"event_time\":%q,\"via\":\"kcat\"}\n", id, id, ts)
	}
	input.WriteString("bad-1|{\"event_id\":\"kcat-bad\",\"event_time\":\"not a time\"}\n")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-P", "-b", b.kafka.ListenAddrs()[0], "-t", b.topic,
		"-K", "|", "-H", "origin=kcat", "-X", "api.version.request=true")
	cmd.Stdin = strings.NewReader(input.String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out.String())
	}

	r := b.start(t)
	waitfor.Until(t, "kcat's records to be ingested", func() bool {
		return ingesttest.Scalar(t, b.pool, "SELECT coalesce(sum(records), 0)::bigint FROM tidemark.kafka_offsets") >= 201
	})
	r.stop(t)
	ingesttest.AssertRaw(t, b.pool, "app_events", want)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE payload->>'via' = 'kcat'"); n != 200 {
		t.Errorf("%d payloads intact, want 200", n)
	}
	var reason, value, hk, hv string
	err = b.pool.QueryRow(context.Background(), `SELECT reason, convert_from(record_value, 'UTF8'),
		convert_from(header_keys[1], 'UTF8'), convert_from(header_values[1], 'UTF8') FROM tidemark.dead_letters`).Scan(&reason, &value, &hk, &hv)
	if err != nil {
		t.Fatalf("read the dead letter: %v", err)
	}
	if reason != "invalid_time" || !strings.Contains(value, "not a time") || hk != "origin" || hv != "kcat" {
		t.Errorf("dead letter = %s %q header %s=%s", reason, value, hk, hv)
	}
}
