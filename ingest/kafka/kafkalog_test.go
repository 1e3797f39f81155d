package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// clientFailures counts the client's failed connections and requests, as
// the client sees them, to compare with what reaches the log.
type clientFailures struct{ n atomic.Int64 }

func (f *clientFailures) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		f.n.Add(1)
	}
}

func (f *clientFailures) OnBrokerE2E(_ kgo.BrokerMetadata, _ int16, e2e kgo.BrokerE2E) {
	if e2e.Err() != nil {
		f.n.Add(1)
	}
}

// TestKafkaClientErrorsLogged: a running ingester whose brokers cannot be
// reached, drop every connection, or go away logs the client's errors
// within seconds, and at most one line of each kind per interval, the
// repeats counted.
func TestKafkaClientErrorsLogged(t *testing.T) {
	const (
		firstWithin = 10 * time.Second // the first line comes at once; this allows for a loaded machine
		observe     = 12 * time.Second // how long the failures are watched
	)
	tests := []struct {
		name  string
		every time.Duration // the rate limit; 0 is the default, 30s
		// setup prepares a failing broker and returns the bundle and a
		// function that starts the failure once the ingester runs.
		setup func(t *testing.T) (*bundle, func(t *testing.T, b *bundle))
	}{
		{"nothing listens", 0, refusingBroker},
		{"every connection dropped", 0, droppingBroker},
		{"every connection dropped, 2s interval", 2 * time.Second, droppingBroker},
		{"cluster closed while consuming", 0, closingCluster},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, fail := tt.setup(t)
			rec := kafkatest.NewLogRecorder(slog.LevelInfo)
			failures := &clientFailures{}
			opts := kafka.Options{Logger: slog.New(rec), KafkaOpts: []kgo.Opt{kgo.WithHooks(failures)}}
			every := tt.every
			if every > 0 {
				kafka.SetKafkaLogEvery(&opts, every)
			} else {
				every = 30 * time.Second
			}
			start := time.Now() // lines and failures count from here
			r := b.startWith(t, opts)
			if fail != nil {
				fail(t, b)
			}
			failed := time.Now()

			ctx, cancel := context.WithTimeout(context.Background(), firstWithin)
			defer cancel()
			first, err := rec.Wait(ctx, func(l kafkatest.LogLine) bool {
				return l.Level >= slog.LevelWarn && !l.Time.Before(start)
			})
			if err != nil {
				t.Fatalf("no Kafka client error logged within %s of the failure; the log has:\n%s", firstWithin, linesText(rec.Lines()))
			}
			t.Logf("first line %s after the failure: %s", first.Time.Sub(failed).Round(time.Millisecond), first)

			time.Sleep(time.Until(failed.Add(observe))) // the period whose log lines are counted, not a wait
			r.stop(t)

			// Warnings of one kind, of the client or of the ingester, are
			// at least the interval apart; later lines count the ones
			// left out.
			var lines []kafkatest.LogLine
			for _, l := range rec.Lines() {
				if l.Level >= slog.LevelWarn && !l.Time.Before(start) {
					lines = append(lines, l)
				}
			}
			last := map[string]time.Time{}
			counted := false
			for _, l := range lines {
				kind := fmt.Sprintf("%s %s broker=%s addr=%s topic=%s partition=%s", l.Attrs["component"], l.Msg,
					l.Attrs["broker"], l.Attrs["addr"], l.Attrs["topic"], l.Attrs["partition"])
				if prev, ok := last[kind]; ok && l.Time.Sub(prev) < every {
					t.Errorf("%q logged again after %s, want at most once per %s:\n%s",
						kind, l.Time.Sub(prev).Round(time.Millisecond), every, linesText(lines))
				}
				last[kind] = l.Time
				counted = counted || l.Attrs["suppressed"] != ""
			}
			n := failures.n.Load()
			t.Logf("%d client failures in %s, %d lines of %d kinds:\n%s", n, observe, len(lines), len(last), linesText(lines))
			if n < 3 {
				t.Errorf("the client failed only %d times: the rate limit was not exercised", n)
			}
			if every < observe/2 && !counted {
				t.Errorf("no line reports suppressed repeats:\n%s", linesText(lines))
			}
		})
	}
}

// refusingBroker points the ingester at an address nothing listens on.
func refusingBroker(t *testing.T) (*bundle, func(*testing.T, *bundle)) {
	t.Helper()
	b := setup(t, 1)
	b.brokers = closedAddr(t)
	return b, nil
}

// droppingBroker is a broker that requires SASL and closes every
// connection after ApiVersions. franz-go logs none of these failures above
// debug: with SASL configured it does not blame a broken first read on
// missing SASL, and a failed SASL handshake on EOF counts as retryable.
func droppingBroker(t *testing.T) (*bundle, func(*testing.T, *bundle)) {
	t.Helper()
	c := kafkatest.NewClusterWith(t, 1, []string{"events"}, kfake.EnableSASL(), kfake.Superuser("PLAIN", "loader", "s3cret"))
	b := setupWith(t, 1, pgtest.NewDatabase(t), c, kgo.SASL(plain.Auth{User: "loader", Pass: "s3cret"}.AsMechanism()))
	b.kafkaYAML = "  sasl: {mechanism: PLAIN, username: loader, password: s3cret, allow_plaintext: true}"
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.Key() == int16(kmsg.ApiVersions) {
			return nil, nil, false
		}
		return nil, errors.New("dropped"), true // closes the connection
	})
	return b, nil
}

// closingCluster closes the cluster once the ingester has loaded a record.
func closingCluster(t *testing.T) (*bundle, func(*testing.T, *bundle)) {
	t.Helper()
	return setup(t, 1), func(t *testing.T, b *bundle) {
		t.Helper()
		p := &produced{end: map[int32]int64{}}
		b.produce(t, p, []*kgo.Record{{Topic: b.topic, Partition: 0,
			Value: []byte(`{"event_id":"e1","event_time":"2026-10-05T10:00:00Z"}`)}})
		b.waitStored(t, p.end, time.Minute)
		b.kafka.Close()
	}
}

// closedAddr returns a local address that nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func linesText(lines []kafkatest.LogLine) string {
	var s string
	for _, l := range lines {
		s += fmt.Sprintln(l)
	}
	return s
}
