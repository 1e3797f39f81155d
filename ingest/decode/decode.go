package decode

import (
	"context"
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

	// The reasons of the registry formats (Avro, Protobuf, JSON Schema).
	ReasonWrongFormat    = "wrong_format"    // not the Confluent wire format, or a schema of another format
	ReasonUnknownSchema  = "unknown_schema"  // the registry says the schema id does not exist
	ReasonInvalidSchema  = "invalid_schema"  // the schema does not compile, or uses what tidemark does not read
	ReasonSchemaMismatch = "schema_mismatch" // the bytes do not decode with their schema

	// ReasonDecodeLimit: a value of a registry format, or a Debezium
	// change, whose decoding would cost more than its record's budget
	// (limits.go): more JSON than ingest.decode_max_expansion times the
	// record's size plus config.DecodeSlack, or than
	// ingest.decode_max_bytes; more items than that JSON can hold;
	// nesting deeper than 256 levels. Such a record may be valid: raising
	// the limit and replaying it loads it.
	ReasonDecodeLimit = "decode_limit"
)

// Reasons lists every dead-letter reason.
var Reasons = []string{ReasonInvalidJSON, ReasonMissingID, ReasonInvalidID, ReasonMissingTime,
	ReasonInvalidTime, ReasonTimeOutOfRange, ReasonRejectedByStore,
	ReasonWrongFormat, ReasonUnknownSchema, ReasonInvalidSchema, ReasonSchemaMismatch, ReasonDecodeLimit,
	ReasonInvalidEnvelope, ReasonMissingKey, ReasonWrongTable}

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
	format        string // event_time_format
	maxAge, maxTS time.Duration
	// valueFormat is the source's format; reg its registry, nil for
	// JSON.
	valueFormat string
	reg         *Registry
	dbz         *debezium // set for a Debezium source
	// limits bound the decoding of one record (the source's Decode).
	limits config.DecodeLimits
}

// NewDecoder builds the decoder for a validated source configuration of
// format JSON; sources of a registry format need NewRegistryDecoder.
func NewDecoder(src *config.Source) (*Decoder, error) {
	if config.UsesRegistry(src.Format) {
		return nil, fmt.Errorf("sources.%s.format: %s needs the schema registry", src.Name, src.Format)
	}
	return newDecoder(src)
}

// NewRegistryDecoder builds the decoder for a validated source
// configuration whose values may be of a registry format, read through
// reg (nil for a JSON source). Decode records of a registry format with
// DecodeWith, after Resolve.
func NewRegistryDecoder(src *config.Source, reg *Registry) (*Decoder, error) {
	if config.UsesRegistry(src.Format) && reg == nil {
		return nil, fmt.Errorf("sources.%s.format: %s needs the schema registry", src.Name, src.Format)
	}
	d, err := newDecoder(src)
	if err != nil {
		return nil, err
	}
	if config.UsesRegistry(src.Format) || src.Kind() == config.KindDebezium {
		// A Debezium source reads the values (and keys) that are in the
		// wire format through the registry when there is one.
		d.valueFormat, d.reg = src.Format, reg
	}
	return d, nil
}

func newDecoder(src *config.Source) (*Decoder, error) {
	d := &Decoder{
		idFallback:   src.EventIDFallback == config.FallbackCoordinates,
		timeFallback: src.EventTimeFallback == config.FallbackRecordTimestamp,
		format:       src.EventTimeFormat,
		maxAge:       src.MaxAge.Duration(),
		maxTS:        src.MaxFutureSkew.Duration(),
		limits:       src.Decode,
	}
	d.idIdx, d.tsIdx = -1, -1
	if src.Kind() == config.KindDebezium {
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

// UsesRegistry reports whether the decoder's records may carry a schema id
// of the registry: Resolve must then precede DecodeWith.
func (d *Decoder) UsesRegistry() bool { return d.reg != nil }

// Resolved reports whether r can be decoded with s (see Schemas.Has); a
// Debezium decoder needs its key's schema too.
func (d *Decoder) Resolved(s Schemas, r *kgo.Record) bool {
	if !s.Has(r) {
		return false
	}
	if d.dbz == nil {
		return true
	}
	id, _, ok := wireID(r.Key)
	return !ok || s[id] != nil
}

// Resolve gets the schemas of recs from the registry (or its cache), in
// record order, each request bounded by schema_registry.timeout. It
// stops at the first schema the registry cannot give, returning the
// schemas resolved so far and an error that wraps
// ErrRegistryUnavailable: the records whose schema is missing (see
// Schemas.Has) are to be decoded later, never dead-lettered. A JSON
// decoder resolves nothing.
func (d *Decoder) Resolve(ctx context.Context, recs []*kgo.Record) (Schemas, error) {
	return d.ResolveUntil(ctx, recs, time.Time{})
}

// ErrResolveTime means that Resolve stopped because its time was up
// (ResolveUntil): the schemas left are for a later call.
var ErrResolveTime = errors.New("no time left to ask the schema registry")

// ResolveUntil is Resolve that asks the registry nothing after until
// (zero: no limit), returning ErrResolveTime then; the schemas in the
// cache are taken whatever the time.
func (d *Decoder) ResolveUntil(ctx context.Context, recs []*kgo.Record, until time.Time) (Schemas, error) {
	if d.reg == nil {
		return nil, nil
	}
	s := Schemas{}
	for _, r := range recs {
		if err := d.resolveOne(ctx, s, r.Value, until); err != nil {
			return s, err
		}
		if d.dbz == nil {
			continue
		}
		// A Debezium record's key is in the converter's format too.
		if err := d.resolveOne(ctx, s, r.Key, until); err != nil {
			return s, err
		}
	}
	return s, nil
}

// resolveOne adds to s the schema of v, a key or value, when v is in the
// wire format.
func (d *Decoder) resolveOne(ctx context.Context, s Schemas, v []byte, until time.Time) error {
	id, _, ok := wireID(v)
	if !ok || s[id] != nil {
		return nil
	}
	if e := d.reg.cached(id); e != nil {
		s[id] = e
		return nil
	}
	if !until.IsZero() && !time.Now().Before(until) {
		return ErrResolveTime
	}
	e, err := d.reg.schema(ctx, id)
	if err != nil {
		return err
	}
	s[id] = e
	return nil
}

// Decode extracts the event from r, or says why it cannot be loaded. now is
// the service clock's time, for the event-time range check. A decoder of
// a registry format finds the schema in its registry's cache: use
// DecodeWith after Resolve.
func (d *Decoder) Decode(r *kgo.Record, now time.Time) (Event, *Rejection) {
	return d.DecodeWith(r, now, nil)
}

// DecodeWith is Decode with the schemas that Resolve returned for r.
func (d *Decoder) DecodeWith(r *kgo.Record, now time.Time, s Schemas) (Event, *Rejection) {
	if d.dbz != nil {
		// A change's event time is its commit time, however old.
		return d.decodeDebezium(r, s)
	}
	value := r.Value
	if d.reg != nil {
		var rej *Rejection
		if value, rej = d.fromRegistry(r.Value, s); rej != nil {
			return Event{}, rej
		}
	}
	if len(value) == 0 {
		return Event{}, &Rejection{ReasonInvalidJSON, "empty value"}
	}
	var found [2][]byte
	if err := pgjson.Scan(value, d.ptrs, found[:len(d.ptrs)]); err != nil {
		if d.reg != nil {
			// Decoded values are JSON by construction, but for what jsonb
			// refuses in them (a string holding U+0000).
			return Event{}, &Rejection{ReasonSchemaMismatch, "the decoded value is not jsonb: " + err.Error()}
		}
		return Event{}, &Rejection{ReasonInvalidJSON, err.Error()}
	}
	ev := Event{Payload: value}

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

	// A null event time is no value, as a missing one: it is how Avro (a
	// null union) and Protobuf (an unset Timestamp) say there is none,
	// and the same event sent as JSON is the same document.
	switch raw := d.field(found, d.tsIdx); {
	case raw != nil && string(raw) != "null":
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
	case raw != nil:
		return Event{}, &Rejection{ReasonMissingTime, "null at " + d.ptrs[d.tsIdx].String() + ", which is no value"}
	default:
		return Event{}, &Rejection{ReasonMissingTime, "no value at " + d.ptrs[d.tsIdx].String()}
	}
	// PostgreSQL stores microseconds; truncate first (rounding would
	// move 23:59:59.9999996 into the next day's partition) so that the
	// row, the ledger, the watermarks and the range check all see the
	// same time, on the day the event names.
	ev.Time = ev.Time.Truncate(time.Microsecond)
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

// fromRegistry decodes a value of a registry format into JSON.
func (d *Decoder) fromRegistry(v []byte, s Schemas) ([]byte, *Rejection) {
	id, payload, ok := wireID(v)
	if !ok {
		return nil, &Rejection{ReasonWrongFormat, fmt.Sprintf("the value is not in the Confluent wire format (magic byte 0, then a 4-byte schema id): it begins %s",
			hexPrefix(v, wireHeader))}
	}
	e, rej := d.entry(id, s, d.valueFormat, "the source's format is "+d.valueFormat)
	if rej != nil {
		return nil, rej
	}
	js, err := e.codec.toJSON(payload, newBudget(d.limits, len(v)))
	if err != nil {
		return nil, decodeRejection(fmt.Sprintf("schema id %d: ", id), err)
	}
	return js, nil
}

// decodeRejection is the rejection of a value that a codec could not
// decode: a decode_limit when decoding it would cost more than its
// budget, else a schema_mismatch; the detail is prefix and err.
func decodeRejection(prefix string, err error) *Rejection {
	if errors.Is(err, errLimit) {
		return &Rejection{ReasonDecodeLimit, prefix + err.Error()}
	}
	return &Rejection{ReasonSchemaMismatch, prefix + err.Error()}
}

// entry is the schema of id, from s or the cache, when it is of format
// want; else why its record is a dead letter (want says why not).
func (d *Decoder) entry(id int, s Schemas, format, want string) (*schemaEntry, *Rejection) {
	e := s[id]
	if e == nil {
		e = d.reg.cached(id)
	}
	switch {
	case e == nil:
		return nil, &Rejection{ReasonUnknownSchema, fmt.Sprintf("schema id %d was not resolved", id)}
	case e.format != "" && e.format != format:
		return nil, &Rejection{ReasonWrongFormat, fmt.Sprintf("schema id %d names a schema of format %s; %s", id, e.format, want)}
	case e.rej != nil:
		return nil, e.rej
	}
	return e, nil
}

// hexPrefix shows the first n bytes of b in hexadecimal.
func hexPrefix(b []byte, n int) string {
	if len(b) == 0 {
		return "nothing (empty value)"
	}
	s := fmt.Sprintf("% x", b[:min(n, len(b))])
	if len(b) > n {
		s += " …"
	}
	return s
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
	return time.UnixMicro(unixMicros(raw, millis)).UTC(), nil
}

// unixMicros is the JSON number raw, of seconds (or, with millis,
// milliseconds), in microseconds rounded down, toward the past, computed
// from its decimal digits: as a float, 1751328000.000001 is a hair less
// and would lose its microsecond. raw is within the years ±9999, so the
// result has 18 digits at most.
func unixMicros(raw []byte, millis bool) int64 {
	neg := raw[0] == '-'
	if neg {
		raw = raw[1:]
	}
	var digits []byte // the significant digits, the point left out
	exp := 6          // the power of ten that digits times gives microseconds
	if millis {
		exp = 3
	}
	i, frac := 0, false
	for ; i < len(raw) && (raw[i] >= '0' && raw[i] <= '9' || raw[i] == '.'); i++ {
		switch {
		case raw[i] == '.':
			frac = true
			continue
		case frac:
			exp--
		}
		if len(digits) > 0 || raw[i] != '0' {
			digits = append(digits, raw[i])
		}
	}
	if i < len(raw) { // an exponent
		e, err := strconv.Atoi(string(raw[i+1:]))
		if err != nil {
			e = -1 << 30 // out of int range: the range check leaves only tiny values
		}
		exp += max(min(e, 1<<30), -1<<30)
	}
	if len(digits) == 0 {
		return 0 // zero, whatever its exponent
	}
	whole, rest := digits, []byte(nil)
	if exp < 0 {
		cut := max(len(digits)+exp, 0)
		whole, rest = digits[:cut], digits[cut:]
	}
	var v int64
	for _, c := range whole {
		v = v*10 + int64(c-'0')
	}
	for range max(exp, 0) { // at most 18 digits in all
		v *= 10
	}
	if neg {
		v = -v
		if strings.Trim(string(rest), "0") != "" {
			v-- // rounded down
		}
	}
	return v
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
