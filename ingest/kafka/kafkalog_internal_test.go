package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
)

// testKafkaLog is a kafkaLog on a settable clock, recording at info.
func testKafkaLog(t *testing.T, every time.Duration) (*kafkaLog, *kafkatest.LogRecorder, *time.Time) {
	t.Helper()
	rec := kafkatest.NewLogRecorder(slog.LevelInfo)
	k := newKafkaLog(slog.New(rec), every)
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	k.now = func() time.Time { return now }
	return k, rec, &now
}

// TestKafkaLogRateLimit: one line per kind per interval, the first at
// once, and the next line says how many were left out.
func TestKafkaLogRateLimit(t *testing.T) {
	type event struct {
		at   time.Duration // since the start
		kind string
	}
	tests := []struct {
		name   string
		events []event
		want   []string // "kind@at suppressed=n" of the lines logged
	}{
		{"first line at once", []event{{0, "a"}}, []string{"a@0s suppressed=0"}},
		{"repeats held back and counted",
			[]event{{0, "a"}, {time.Second, "a"}, {5 * time.Second, "a"}, {29 * time.Second, "a"}, {30 * time.Second, "a"}, {31 * time.Second, "a"}},
			[]string{"a@0s suppressed=0", "a@30s suppressed=3"}},
		{"kinds are independent",
			[]event{{0, "a"}, {time.Second, "b"}, {2 * time.Second, "a"}, {3 * time.Second, "b"}, {31 * time.Second, "b"}},
			[]string{"a@0s suppressed=0", "b@1s suppressed=0", "b@31s suppressed=1"}},
		{"no count after a quiet interval",
			[]event{{0, "a"}, {time.Minute, "a"}, {3 * time.Minute, "a"}},
			[]string{"a@0s suppressed=0", "a@1m0s suppressed=0", "a@3m0s suppressed=0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, rec, now := testKafkaLog(t, 30*time.Second)
			start := *now
			for _, e := range tt.events {
				*now = start.Add(e.at)
				k.emit(slog.LevelWarn, e.kind, "failed", "kind", e.kind, "at", e.at.String())
			}
			var got []string
			for _, l := range rec.Lines() {
				n := l.Attrs["suppressed"]
				if n == "" {
					n = "0"
				}
				got = append(got, fmt.Sprintf("%s@%s suppressed=%s", l.Attrs["kind"], l.Attrs["at"], n))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestKafkaLogKinds: which client messages and hook calls become
// warnings or errors, and which stay at debug.
func TestKafkaLogKinds(t *testing.T) {
	meta := kgo.BrokerMetadata{NodeID: 1, Host: "kafka-1", Port: 9092}
	refused := errors.New("dial tcp 10.0.0.1:9092: connect: connection refused")
	tests := []struct {
		name string
		log  func(k *kafkaLog)
		want string // "LEVEL message", or "" for nothing at info or above
	}{
		{"franz-go error", func(k *kafkaLog) { k.Log(kgo.LogLevelError, "group manage loop errored", "err", io.EOF) },
			"ERROR group manage loop errored"},
		{"franz-go warning", func(k *kafkaLog) { k.Log(kgo.LogLevelWarn, "unable to open connection to broker", "err", refused) },
			"WARN unable to open connection to broker"},
		{"franz-go warning without error", func(k *kafkaLog) { k.Log(kgo.LogLevelWarn, "metadata update is missing the topic ID") },
			"WARN metadata update is missing the topic ID"},
		{"info with an error", func(k *kafkaLog) { k.Log(kgo.LogLevelInfo, "heartbeat errored", "err", kerr.UnknownMemberID) },
			"WARN heartbeat errored"},
		{"info without error", func(k *kafkaLog) { k.Log(kgo.LogLevelInfo, "assigning partitions", "why", "x") }, ""},
		{"info with a nil error", func(k *kafkaLog) { k.Log(kgo.LogLevelInfo, "read Fetch", "err", nil) }, ""},
		{"rebalance starting", func(k *kafkaLog) { k.Log(kgo.LogLevelInfo, "heartbeat errored", "err", kerr.RebalanceInProgress) }, ""},
		{"client closing", func(k *kafkaLog) {
			k.Log(kgo.LogLevelError, "join failed", "err", fmt.Errorf("x: %w", kgo.ErrClientClosed))
		}, ""},
		{"cancelled", func(k *kafkaLog) { k.Log(kgo.LogLevelWarn, "join group failed", "err", context.Canceled) }, ""},
		{"debug", func(k *kafkaLog) {
			k.Log(kgo.LogLevelDebug, "read from broker errored, killing connection", "err", io.EOF)
		}, ""},
		{"dial failed", func(k *kafkaLog) { k.OnBrokerConnect(meta, time.Millisecond, nil, refused) },
			"WARN cannot connect to Kafka broker"},
		{"connected", func(k *kafkaLog) { k.OnBrokerConnect(meta, time.Millisecond, nil, nil) }, ""},
		{"connection broke", func(k *kafkaLog) {
			k.OnBrokerE2E(meta, int16(kmsg.Heartbeat), kgo.BrokerE2E{ReadErr: io.EOF})
		}, "WARN Kafka request failed"},
		{"write failed", func(k *kafkaLog) {
			k.OnBrokerE2E(meta, int16(kmsg.Fetch), kgo.BrokerE2E{WriteErr: errors.New("broken pipe")})
		}, "WARN Kafka request failed"},
		{"request answered", func(k *kafkaLog) { k.OnBrokerE2E(meta, int16(kmsg.Fetch), kgo.BrokerE2E{}) }, ""},
		{"connection set-up is the connect hook's", func(k *kafkaLog) {
			k.OnBrokerE2E(meta, int16(kmsg.SASLHandshake), kgo.BrokerE2E{ReadErr: io.EOF})
		}, ""},
		{"request cancelled", func(k *kafkaLog) {
			k.OnBrokerE2E(meta, int16(kmsg.Fetch), kgo.BrokerE2E{ReadErr: context.Canceled})
		}, ""},
		{"fallout of a broken connection", func(k *kafkaLog) {
			k.OnBrokerE2E(meta, int16(kmsg.Fetch), kgo.BrokerE2E{ReadErr: errors.New(errChosenBrokerDeadText)})
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, rec, _ := testKafkaLog(t, 30*time.Second)
			tt.log(k)
			var got []string
			for _, l := range rec.Lines() {
				got = append(got, l.Level.String()+" "+l.Msg)
			}
			if strings.Join(got, "\n") != tt.want {
				t.Errorf("logged %q, want %q", got, tt.want)
			}
		})
	}
}

// TestKafkaLogLevel asks franz-go for its info lines, and for its debug
// lines only when the service log is at debug.
func TestKafkaLogLevel(t *testing.T) {
	for _, tt := range []struct {
		level slog.Level
		want  kgo.LogLevel
	}{
		{slog.LevelDebug, kgo.LogLevelDebug},
		{slog.LevelInfo, kgo.LogLevelInfo},
		{slog.LevelWarn, kgo.LogLevelInfo},
	} {
		k := newKafkaLog(slog.New(kafkatest.NewLogRecorder(tt.level)), 0)
		if got := k.Level(); got != tt.want {
			t.Errorf("service log at %s: client level %s, want %s", tt.level, got, tt.want)
		}
	}
}
