package decode

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// Dead-letter reasons. They are stable: metrics, the dead_letters table and
// alerting rules use them.
const (
	ReasonInvalidJSON     = "invalid_json"      // value empty or not JSON that jsonb accepts
	ReasonMissingID       = "missing_id"        // no value at the event_id pointer
	ReasonInvalidID       = "invalid_id"        // event_id not a non-empty string or integer of at most 512 bytes
	ReasonMissingTime     = "missing_time"      // no value at the event_time pointer
	ReasonInvalidTime     = "invalid_time"      // event_time not a time in the configured format
	ReasonTimeOutOfRange  = "time_out_of_range" // event_time outside [now - max_age, now + max_future_skew]
	ReasonRejectedByStore = "rejected"          // the warehouse refused the row
)

// Reasons lists every dead-letter reason.
var Reasons = []string{ReasonInvalidJSON, ReasonMissingID, ReasonInvalidID, ReasonMissingTime,
	ReasonInvalidTime, ReasonTimeOutOfRange, ReasonRejectedByStore, ReasonInvalidEnvelope, ReasonMissingKey}

// MaxIDBytes bounds event ids so they always fit a btree index entry.
const MaxIDBytes = 512

// Event is a decoded record bound for raw.<source>.
type Event struct {
	ID      string
	Time    time.Time
	Payload []byte
	// Change is the row change of a Debezium source's record; nil for
	// other sources.
	Change *Change
	// Skip, when not empty, says why the record holds nothing to load
	// (SkipTombstone): it is counted, and neither stored nor a dead
	// letter.
	Skip string
}

// Rejection is why a record cannot be loaded.
type Rejection struct {
	Reason string
	Detail string
}

// Decoder turns Kafka records of one source into events.
type Decoder struct {
	ptrs          []pgjson.Pointer // the configured pointers, scanned in one pass
	idIdx, tsIdx  int              // index of each pointer in ptrs, -1 when not configured
	idFallback    bool
	timeFallback  bool
	format        string
	maxAge, maxTS time.Duration
	dbz           *debezium // set for a Debezium source
}

// NewDecoder builds the decoder for a validated source configuration.
func NewDecoder(src *config.Source) (*Decoder, error) {
	d := &Decoder{
		idFallback:   src.EventIDFallback == config.FallbackCoordinates,
		timeFallback: src.EventTimeFallback == config.FallbackRecordTimestamp,
		format:       src.EventTimeFormat,
		maxAge:       src.MaxAge.D(),
		maxTS:        src.MaxFutureSkew.D(),
	}
	d.idIdx, d.tsIdx = -1, -1
	if src.Debezium() {
		d.dbz = &debezium{}
		return d, nil
	}
	for _, f := range []struct {
		text string
		idx  *int
	}{{src.EventID, &d.idIdx}, {src.EventTime, &d.tsIdx}} {
		if f.text == "" {
			continue
		}
		p, err := pgjson.ParsePointer(f.text)
		if err != nil {
			return nil, err
		}
		*f.idx = len(d.ptrs)
		d.ptrs = append(d.ptrs, p)
	}
	return d, nil
}

// Decode extracts the event from r, or says why it cannot be loaded. now is
// the service clock's time, for the event-time range check.
func (d *Decoder) Decode(r *kgo.Record, now time.Time) (Event, *Rejection) {
	if d.dbz != nil {
		// A change's event time is its commit time, however old.
		return d.decodeDebezium(r)
	}
	if len(r.Value) == 0 {
		return Event{}, &Rejection{ReasonInvalidJSON, "empty value"}
	}
	var found [2][]byte
	if err := pgjson.Scan(r.Value, d.ptrs, found[:len(d.ptrs)]); err != nil {
		return Event{}, &Rejection{ReasonInvalidJSON, err.Error()}
	}
	ev := Event{Payload: r.Value}

	switch raw := d.field(found, d.idIdx); {
	case raw != nil:
		id, err := eventID(raw)
		if err != nil {
			return Event{}, &Rejection{ReasonInvalidID, err.Error()}
		}
		ev.ID = id
	case d.idFallback:
		ev.ID = r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
	default:
		return Event{}, &Rejection{ReasonMissingID, "no value at " + d.ptrs[d.idIdx].String()}
	}

	switch raw := d.field(found, d.tsIdx); {
	case raw != nil:
		t, err := parseTime(raw, d.format)
		if errors.Is(err, errTimeRange) {
			return Event{}, &Rejection{ReasonTimeOutOfRange, err.Error()}
		}
		if err != nil {
			return Event{}, &Rejection{ReasonInvalidTime, err.Error()}
		}
		ev.Time = t
	case d.timeFallback:
		ev.Time = r.Timestamp
	default:
		return Event{}, &Rejection{ReasonMissingTime, "no value at " + d.ptrs[d.tsIdx].String()}
	}
	// PostgreSQL stores microseconds; round first so that the row, the
	// ledger, the watermarks and the range check all see the same time.
	ev.Time = ev.Time.Round(time.Microsecond)
	if lo := now.Add(-d.maxAge); ev.Time.Before(lo) {
		return Event{}, &Rejection{ReasonTimeOutOfRange, fmt.Sprintf("event time %s is older than max_age (%s before %s)",
			ev.Time.UTC().Format(time.RFC3339Nano), d.maxAge, now.UTC().Format(time.RFC3339))}
	}
	if hi := now.Add(d.maxTS); ev.Time.After(hi) {
		return Event{}, &Rejection{ReasonTimeOutOfRange, fmt.Sprintf("event time %s is more than max_future_skew (%s) after %s",
			ev.Time.UTC().Format(time.RFC3339Nano), d.maxTS, now.UTC().Format(time.RFC3339))}
	}
	return ev, nil
}

func (d *Decoder) field(found [2][]byte, idx int) []byte {
	if idx < 0 {
		return nil
	}
	return found[idx]
}

func eventID(raw []byte) (string, error) {
	var id string
	switch c := raw[0]; {
	case c == '"':
		s, err := pgjson.Unquote(raw)
		if err != nil {
			return "", fmt.Errorf("event id: %w", err)
		}
		id = s
	case c == '-' || (c >= '0' && c <= '9'):
		if strings.ContainsAny(string(raw), ".eE") {
			return "", fmt.Errorf("event id %s is a number with a fraction or exponent; use a string or an integer", raw)
		}
		id = string(raw)
	default:
		return "", fmt.Errorf("event id must be a string or an integer, got %s", truncate(raw, 40))
	}
	switch {
	case id == "":
		return "", errors.New("event id is empty")
	case len(id) > MaxIDBytes:
		return "", fmt.Errorf("event id is %d bytes, more than %d", len(id), MaxIDBytes)
	}
	return id, nil
}

// parseTime reads an event time in the given format: RFC 3339 text, or
// unix seconds or milliseconds as a JSON number; auto accepts all three,
// reading numbers of magnitude 1e11 or more as milliseconds.
func parseTime(raw []byte, format string) (time.Time, error) {
	if raw[0] == '"' {
		if format == config.TimeUnixSeconds || format == config.TimeUnixMillis {
			return time.Time{}, fmt.Errorf("event time %s is a string; event_time_format %s expects a number", truncate(raw, 40), format)
		}
		s, err := pgjson.Unquote(raw)
		if err != nil {
			return time.Time{}, fmt.Errorf("event time: %w", err)
		}
		// RFC 3339 allows lower-case t and z; Go's parser does not.
		t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s))
		if err != nil {
			return time.Time{}, fmt.Errorf("event time %q is not RFC 3339 (e.g. 2026-10-05T09:15:00Z)", truncate([]byte(s), 40))
		}
		return t, nil
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return time.Time{}, fmt.Errorf("event time must be a string or a number, got %s", truncate(raw, 40))
	}
	if format == config.TimeRFC3339 {
		return time.Time{}, fmt.Errorf("event time %s is a number; event_time_format rfc3339 expects a string", raw)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if errors.Is(err, strconv.ErrRange) {
		return time.Time{}, fmt.Errorf("%w: event time %s is outside the years -9999 to 9999", errTimeRange, truncate(raw, 40))
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("event time %s is not a number", truncate(raw, 40))
	}
	millis := format == config.TimeUnixMillis || (format == config.TimeAuto && math.Abs(v) >= 1e11)
	micros := v * 1e6
	if millis {
		micros = v * 1e3
	}
	// Years beyond ±9999 are no event time; this also keeps the
	// conversion below far from int64 overflow.
	if math.IsInf(micros, 0) || math.Abs(micros) > maxUnixMicros {
		return time.Time{}, fmt.Errorf("%w: event time %s is outside the years -9999 to 9999", errTimeRange, truncate(raw, 40))
	}
	return time.UnixMicro(int64(math.Round(micros))).UTC(), nil
}

// errTimeRange marks a well-formed time too far from any plausible date.
var errTimeRange = errors.New("time out of range")

// maxUnixMicros is the year 9999 in unix microseconds, rounded up.
const maxUnixMicros = 2.6e17

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
