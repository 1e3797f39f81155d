package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kafkaLogEvery is how often at most one kind of Kafka client error is
// logged. A broker that is down fails every retry; the first failure is
// logged at once, the repeats within this interval are counted and the
// next line of the same kind reports them as "suppressed".
const kafkaLogEvery = 30 * time.Second

// kafkaLogKinds bounds the number of kinds remembered; beyond it, kinds
// not logged for a whole interval are forgotten.
const kafkaLogKinds = 256

// kafkaLog sends the Kafka client's errors to the service log, rate
// limited per kind. It is the client's logger (kgo.Logger) and also hooks
// into its connections (kgo.HookBrokerConnect, kgo.HookBrokerE2E): franz-go
// logs failed dials at warn, but broken connections, failed connection
// set-up (ApiVersions, SASL) and failed requests only at debug, and
// heartbeat errors at info.
//
// Lines of franz-go's own warnings and errors keep its message and level;
// its info lines that carry an error become warnings; everything else
// goes to debug. Errors that only say the client or a request was
// cancelled, or that follow from a connection already reported, are
// logged at debug.
type kafkaLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*kafkaLogKind

	// auth, when set, logs TLS and SASL refusals in its own words.
	auth *kafkaAuth
}

type kafkaLogKind struct {
	last       time.Time // when a line of this kind was last logged
	suppressed int       // lines left out since then
}

var (
	_ kgo.Logger            = (*kafkaLog)(nil)
	_ kgo.HookBrokerConnect = (*kafkaLog)(nil)
	_ kgo.HookBrokerE2E     = (*kafkaLog)(nil)
)

func newKafkaLog(log *slog.Logger, every time.Duration) *kafkaLog {
	if every <= 0 {
		every = kafkaLogEvery
	}
	return &kafkaLog{log: log, every: every, now: time.Now, kinds: map[string]*kafkaLogKind{}}
}

// admit reports whether a line of kind may be logged now, and how many
// lines of that kind were left out since the last one.
func (k *kafkaLog) admit(kind string) (bool, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	s := k.kinds[kind]
	if s == nil {
		if len(k.kinds) >= kafkaLogKinds {
			for name, o := range k.kinds {
				if now.Sub(o.last) >= k.every {
					delete(k.kinds, name)
				}
			}
		}
		k.kinds[kind] = &kafkaLogKind{last: now}
		return true, 0
	}
	if now.Sub(s.last) < k.every {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	return true, n
}

// emit logs one line of kind at level unless the rate limit holds it back.
func (k *kafkaLog) emit(level slog.Level, kind, msg string, args ...any) {
	ok, suppressed := k.admit(kind)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	k.log.Log(context.Background(), level, msg, args...)
}

// Level asks franz-go for its info lines, which carry heartbeat and
// commit errors, or for everything when the service log is at debug.
func (k *kafkaLog) Level() kgo.LogLevel {
	if k.log.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelInfo
}

// Log implements kgo.Logger.
func (k *kafkaLog) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	err := errorIn(keyvals)
	if b, _ := valueOf(keyvals, "broker"); err != nil && k.auth.report(stageUnknown, fmt.Sprint(b), fmt.Sprint(b), err) {
		return
	}
	routine := err != nil && routineKafkaError(err)
	var to slog.Level
	switch {
	case level == kgo.LogLevelError && !routine:
		to = slog.LevelError
	case level == kgo.LogLevelWarn && !routine:
		to = slog.LevelWarn
	case level == kgo.LogLevelInfo && err != nil && !routine:
		to = slog.LevelWarn
	default:
		k.log.Debug(msg, keyvals...)
		return
	}
	kind := msg
	if b, ok := valueOf(keyvals, "broker"); ok {
		kind += "\x00" + fmt.Sprint(b)
	}
	k.emit(to, kind, msg, keyvals...)
}

// OnBrokerConnect logs a failed dial or connection set-up.
func (k *kafkaLog) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil || routineKafkaError(err) {
		return
	}
	addr := brokerAddr(meta)
	if k.auth.report(stageUnknown, kgo.NodeName(meta.NodeID), addr, err) {
		return
	}
	k.emit(slog.LevelWarn, "connect\x00"+addr, "cannot connect to Kafka broker",
		"broker", kgo.NodeName(meta.NodeID), "addr", addr, "err", err)
}

// OnBrokerE2E logs a request whose connection broke or timed out. A
// failure while setting a connection up is left to OnBrokerConnect.
func (k *kafkaLog) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	err := e2e.Err()
	if err == nil || routineKafkaError(err) {
		return
	}
	addr := brokerAddr(meta)
	switch kmsg.Key(key) {
	case kmsg.SASLHandshake, kmsg.SASLAuthenticate:
		k.auth.report(stageSASL, kgo.NodeName(meta.NodeID), addr, err)
		return
	case kmsg.ApiVersions:
		k.auth.report(stageUnknown, kgo.NodeName(meta.NodeID), addr, err)
		return
	}
	k.emit(slog.LevelWarn, "request\x00"+addr, "Kafka request failed",
		"broker", kgo.NodeName(meta.NodeID), "addr", addr, "request", kmsg.NameForKey(key), "err", err)
}

// errChosenBrokerDeadText is the text of a franz-go error (not exported)
// that requests in flight get when their connection breaks; the first of
// them carries the real cause.
const errChosenBrokerDeadText = "the broker connection has died and the request will be retried on a new connection"

// routineKafkaError reports errors that need no operator (cancellation,
// a closing client, a rebalance starting) or that repeat one logged
// already (fallout of a broken connection, the end of a group session
// passed on to polls).
func routineKafkaError(err error) bool {
	var session *kgo.ErrGroupSession // passed on to polls; the error itself is logged where it happens
	return errors.As(err, &session) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, kgo.ErrClientClosed) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, kerr.RebalanceInProgress) ||
		err.Error() == errChosenBrokerDeadText
}

func errorIn(keyvals []any) error {
	v, _ := valueOf(keyvals, "err")
	err, _ := v.(error)
	return err
}

func valueOf(keyvals []any, key string) (any, bool) {
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, ok := keyvals[i].(string); ok && k == key {
			return keyvals[i+1], true
		}
	}
	return nil, false
}

func brokerAddr(meta kgo.BrokerMetadata) string {
	return net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
}
