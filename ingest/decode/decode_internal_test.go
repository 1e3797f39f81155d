package decode

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// decodeNow is the service clock in the decode tests.
var decodeNow = time.Date(2026, 10, 5, 9, 15, 0, 0, time.UTC)

// testSource returns a source with every field that matters to the decoder
// set explicitly (config.Parse would apply defaults; these tests do not go
// through it): /id and /ts, auto format, no fallbacks, max_age 90d and
// max_future_skew 1h.
func testSource() *config.Source {
	return &config.Source{
		Kafka:             &config.KafkaSource{Topics: []string{"events"}},
		EventID:           "/id",
		EventIDFallback:   "",
		EventTime:         "/ts",
		EventTimeFormat:   config.TimeAuto,
		EventTimeFallback: "",
		MaxAge:            config.Duration(90 * 24 * time.Hour),
		MaxFutureSkew:     config.Duration(time.Hour),
		RawPartition:      config.PartitionDay,
		Watermark: config.Watermark{
			OutOfOrderness: 0,
			IdleTimeout:    config.Duration(5 * time.Minute),
		},
		Name: "app_events",
	}
}

// record returns a record at events/3/42 with the given value, timestamped
// a minute before decodeNow.
func record(value string) *kgo.Record {
	return &kgo.Record{
		Topic:     "events",
		Partition: 3,
		Offset:    42,
		Key:       []byte("k"),
		Value:     []byte(value),
		Timestamp: decodeNow.Add(-time.Minute),
	}
}

func newTestDecoder(t *testing.T, src *config.Source) *Decoder {
	t.Helper()
	d, err := NewDecoder(src)
	if err != nil {
		t.Fatalf("NewDecoder: %v", err)
	}
	return d
}

// doc builds {"id":<id>,"ts":<ts>} from raw JSON texts; an empty text
// leaves the field out.
func doc(id, ts string) string {
	var fields []string
	if id != "" {
		fields = append(fields, `"id":`+id)
	}
	if ts != "" {
		fields = append(fields, `"ts":`+ts)
	}
	return "{" + strings.Join(fields, ",") + "}"
}

const goodTS = `"2026-10-05T09:00:00Z"`

// lastMicro is the last microsecond of 2025-06-30 (UTC).
var lastMicro = time.Date(2025, 6, 30, 23, 59, 59, 999_999_000, time.UTC)

var goodTime = time.Date(2026, 10, 5, 9, 0, 0, 0, time.UTC)

func TestDecode(t *testing.T) {
	unixNow := decodeNow.Unix() // 1791191700
	tests := []struct {
		name string
		src  func(*config.Source)
		val  string
		rec  func(*kgo.Record)
		now  time.Time // zero: decodeNow

		reason string // "" when the record decodes
		id     string
		time   time.Time
	}{
		// invalid_json
		{name: "empty value", val: "", reason: ReasonInvalidJSON},
		{name: "nil value", rec: func(r *kgo.Record) { r.Value = nil }, reason: ReasonInvalidJSON},
		{name: "whitespace value", val: "  \n", reason: ReasonInvalidJSON},
		{name: "not JSON", val: "hello", reason: ReasonInvalidJSON},
		{name: "truncated", val: `{"id":"a","ts":"2026-10-05T09:00:00Z"`, reason: ReasonInvalidJSON},
		{name: "trailing data", val: doc(`"a"`, goodTS) + "x", reason: ReasonInvalidJSON},
		{name: "two documents", val: doc(`"a"`, goodTS) + doc(`"b"`, goodTS), reason: ReasonInvalidJSON},
		{name: "u0000", val: `{"id":"a","ts":"2026-10-05T09:00:00Z","x":"\u0000"}`, reason: ReasonInvalidJSON},
		{name: "lone surrogate", val: `{"id":"a","ts":"2026-10-05T09:00:00Z","x":"\ud800"}`, reason: ReasonInvalidJSON},
		{name: "invalid UTF-8", val: "{\"id\":\"a\xff\",\"ts\":\"2026-10-05T09:00:00Z\"}", reason: ReasonInvalidJSON},
		{name: "too deep", val: `{"id":"a","ts":"2026-10-05T09:00:00Z","x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`, reason: ReasonInvalidJSON},
		{name: "invalid JSON wins over missing id", val: `{"x":`, reason: ReasonInvalidJSON},
		{name: "invalid JSON with fallbacks", val: `{`, reason: ReasonInvalidJSON,
			src: func(s *config.Source) {
				s.EventIDFallback = config.FallbackCoordinates
				s.EventTimeFallback = config.FallbackRecordTimestamp
			}},

		// missing_id
		{name: "no id", val: doc("", goodTS), reason: ReasonMissingID},
		{name: "id under another key", val: `{"event_id":"a","ts":"2026-10-05T09:00:00Z"}`, reason: ReasonMissingID},
		{name: "top-level array", val: `["a"]`, reason: ReasonMissingID},
		{name: "top-level string", val: `"a"`, reason: ReasonMissingID},
		{name: "nested id absent", val: `{"meta":{},"ts":"2026-10-05T09:00:00Z"}`, reason: ReasonMissingID,
			src: func(s *config.Source) { s.EventID = "/meta/id" }},
		{name: "id pointer into a scalar", val: `{"meta":"x","ts":"2026-10-05T09:00:00Z"}`, reason: ReasonMissingID,
			src: func(s *config.Source) { s.EventID = "/meta/id" }},
		{name: "missing id is checked before time", val: `{"ts":"nonsense"}`, reason: ReasonMissingID},

		// invalid_id
		{name: "empty string id", val: doc(`""`, goodTS), reason: ReasonInvalidID},
		{name: "object id", val: doc(`{"v":1}`, goodTS), reason: ReasonInvalidID},
		{name: "array id", val: doc(`["a"]`, goodTS), reason: ReasonInvalidID},
		{name: "float id", val: doc(`1.5`, goodTS), reason: ReasonInvalidID},
		{name: "integral float id", val: doc(`1.0`, goodTS), reason: ReasonInvalidID},
		{name: "exponent id", val: doc(`1e3`, goodTS), reason: ReasonInvalidID},
		{name: "upper exponent id", val: doc(`1E3`, goodTS), reason: ReasonInvalidID},
		{name: "negative exponent id", val: doc(`-2e-1`, goodTS), reason: ReasonInvalidID},
		{name: "true id", val: doc(`true`, goodTS), reason: ReasonInvalidID},
		{name: "false id", val: doc(`false`, goodTS), reason: ReasonInvalidID},
		{name: "null id", val: doc(`null`, goodTS), reason: ReasonInvalidID},
		{name: "513 byte id", val: doc(`"`+strings.Repeat("x", 513)+`"`, goodTS), reason: ReasonInvalidID},
		{name: "514 byte non-ascii id", val: doc(`"`+strings.Repeat("é", 257)+`"`, goodTS), reason: ReasonInvalidID},
		{name: "513 byte escaped id", val: doc(`"`+strings.Repeat(`\u00e9`, 256)+`x"`, goodTS), reason: ReasonInvalidID},
		{name: "513 digit integer id", val: doc(strings.Repeat("9", 513), goodTS), reason: ReasonInvalidID},
		{name: "invalid id with coordinates fallback", val: doc(`""`, goodTS), reason: ReasonInvalidID,
			src: func(s *config.Source) { s.EventIDFallback = config.FallbackCoordinates }},
		{name: "float id with coordinates fallback", val: doc(`2.5`, goodTS), reason: ReasonInvalidID,
			src: func(s *config.Source) { s.EventIDFallback = config.FallbackCoordinates }},
		{name: "invalid id is checked before time", val: doc(`{}`, `"nonsense"`), reason: ReasonInvalidID},

		// Good ids.
		{name: "string id", val: doc(`"evt-1"`, goodTS), id: "evt-1", time: goodTime},
		{name: "escaped string id", val: doc(`"a\u0062c\/d\n"`, goodTS), id: "abc/d\n", time: goodTime},
		{name: "non-ascii id", val: doc(`"é😀"`, goodTS), id: "é😀", time: goodTime},
		{name: "512 byte id", val: doc(`"`+strings.Repeat("x", 512)+`"`, goodTS), id: strings.Repeat("x", 512), time: goodTime},
		{name: "512 byte escaped id", val: doc(`"`+strings.Repeat(`\u00e9`, 256)+`"`, goodTS), id: strings.Repeat("é", 256), time: goodTime},
		{name: "integer id", val: doc(`42`, goodTS), id: "42", time: goodTime},
		{name: "zero id", val: doc(`0`, goodTS), id: "0", time: goodTime},
		{name: "negative integer id", val: doc(`-7`, goodTS), id: "-7", time: goodTime},
		{name: "huge integer id", val: doc(`123456789012345678901234567890`, goodTS), id: "123456789012345678901234567890", time: goodTime},
		{name: "512 digit integer id", val: doc(strings.Repeat("9", 512), goodTS), id: strings.Repeat("9", 512), time: goodTime},
		{name: "whitespace around id", val: `{"id" :  "a" , "ts":"2026-10-05T09:00:00Z"}`, id: "a", time: goodTime},
		{name: "duplicate id key, last wins", val: `{"id":"first","id":"second","ts":"2026-10-05T09:00:00Z"}`, id: "second", time: goodTime},
		{name: "duplicate id key, last invalid", val: `{"id":"first","id":{},"ts":"2026-10-05T09:00:00Z"}`, reason: ReasonInvalidID},
		{name: "nested pointers", val: `{"meta":{"id":"n","ts":"2026-10-05T09:00:00Z"}}`, id: "n", time: goodTime,
			src: func(s *config.Source) { s.EventID, s.EventTime = "/meta/id", "/meta/ts" }},
		{name: "nested pointers through duplicate key", val: `{"meta":{"id":"old","ts":"2026-10-05T09:00:00Z"},"meta":{"id":"new"}}`, reason: ReasonMissingTime,
			src: func(s *config.Source) { s.EventID, s.EventTime = "/meta/id", "/meta/ts" }},
		{name: "array index pointer", val: `{"ids":["x","y"],"ts":"2026-10-05T09:00:00Z"}`, id: "y", time: goodTime,
			src: func(s *config.Source) { s.EventID = "/ids/1" }},
		{name: "escaped pointer", val: `{"a/b":"s","t~":"2026-10-05T09:00:00Z"}`, id: "s", time: goodTime,
			src: func(s *config.Source) { s.EventID, s.EventTime = "/a~1b", "/t~0" }},

		// event_id_fallback: coordinates.
		{name: "coordinates fallback", val: doc("", goodTS), id: "events/3/42", time: goodTime,
			src: func(s *config.Source) { s.EventIDFallback = config.FallbackCoordinates }},
		{name: "coordinates fallback other record", val: doc("", goodTS), id: "orders.v2/0/9223372036854775807", time: goodTime,
			src: func(s *config.Source) { s.EventIDFallback = config.FallbackCoordinates },
			rec: func(r *kgo.Record) { r.Topic, r.Partition, r.Offset = "orders.v2", 0, 1<<63-1 }},
		{name: "coordinates fallback not used when id present", val: doc(`"mine"`, goodTS), id: "mine", time: goodTime,
			src: func(s *config.Source) { s.EventIDFallback = config.FallbackCoordinates }},
		{name: "coordinates only", val: doc(`"ignored"`, goodTS), id: "events/3/42", time: goodTime,
			src: func(s *config.Source) { s.EventID, s.EventIDFallback = "", config.FallbackCoordinates }},

		// missing_time
		{name: "no time", val: doc(`"a"`, ""), reason: ReasonMissingTime},
		{name: "time under another key", val: `{"id":"a","time":"2026-10-05T09:00:00Z"}`, reason: ReasonMissingTime},
		{name: "nested time absent", val: `{"id":"a","meta":[]}`, reason: ReasonMissingTime,
			src: func(s *config.Source) { s.EventTime = "/meta/ts" }},

		// invalid_time
		{name: "bad text", val: doc(`"a"`, `"yesterday at noon"`), reason: ReasonInvalidTime},
		{name: "empty text", val: doc(`"a"`, `""`), reason: ReasonInvalidTime},
		{name: "date only", val: doc(`"a"`, `"2026-10-05"`), reason: ReasonInvalidTime},
		{name: "no zone", val: doc(`"a"`, `"2026-10-05T09:00:00"`), reason: ReasonInvalidTime},
		{name: "space for T", val: doc(`"a"`, `"2026-10-05 09:00:00Z"`), reason: ReasonInvalidTime},
		{name: "month 13", val: doc(`"a"`, `"2026-13-05T09:00:00Z"`), reason: ReasonInvalidTime},
		{name: "numeric text", val: doc(`"a"`, fmt.Sprintf(`"%d"`, unixNow)), reason: ReasonInvalidTime},
		{name: "true time", val: doc(`"a"`, `true`), reason: ReasonInvalidTime},
		{name: "null time", val: doc(`"a"`, `null`), reason: ReasonMissingTime},
		{name: "object time", val: doc(`"a"`, `{"s":1}`), reason: ReasonInvalidTime},
		{name: "array time", val: doc(`"a"`, `[1]`), reason: ReasonInvalidTime},
		{name: "number beyond the year 9999", val: doc(`"a"`, `1e17`), reason: ReasonTimeOutOfRange},
		{name: "negative number before the year -9999", val: doc(`"a"`, `-1e17`), reason: ReasonTimeOutOfRange},
		{name: "number beyond float range", val: doc(`"a"`, `1e400`), reason: ReasonTimeOutOfRange},
		{name: "string when unix_seconds", val: doc(`"a"`, goodTS), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "numeric string when unix_seconds", val: doc(`"a"`, fmt.Sprintf(`"%d"`, unixNow)), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "string when unix_millis", val: doc(`"a"`, goodTS), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
		{name: "number when rfc3339", val: doc(`"a"`, fmt.Sprint(unixNow)), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeRFC3339 }},
		{name: "bad text when rfc3339", val: doc(`"a"`, `"now"`), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeRFC3339 }},

		// event_time_fallback: record_timestamp.
		{name: "record timestamp when time missing", val: doc(`"a"`, ""), id: "a", time: decodeNow.Add(-time.Minute),
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp }},
		{name: "record timestamp not used for invalid time", val: doc(`"a"`, `"garbage"`), reason: ReasonInvalidTime,
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp }},
		{name: "record timestamp for null time", val: doc(`"a"`, `null`), id: "a", time: decodeNow.Add(-time.Minute),
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp }},
		{name: "record timestamp not used for wrong-format time", val: doc(`"a"`, goodTS), reason: ReasonInvalidTime,
			src: func(s *config.Source) {
				s.EventTimeFallback = config.FallbackRecordTimestamp
				s.EventTimeFormat = config.TimeUnixMillis
			}},
		{name: "record timestamp not used when time present", val: doc(`"a"`, goodTS), id: "a", time: goodTime,
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp }},
		{name: "record timestamp only", val: doc(`"a"`, goodTS), id: "a", time: decodeNow.Add(-time.Minute),
			src: func(s *config.Source) { s.EventTime, s.EventTimeFallback = "", config.FallbackRecordTimestamp }},
		{name: "record timestamp is range checked", val: doc(`"a"`, ""), reason: ReasonTimeOutOfRange,
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp },
			rec: func(r *kgo.Record) { r.Timestamp = decodeNow.Add(-91 * 24 * time.Hour) }},
		{name: "record timestamp is truncated", val: doc(`"a"`, ""), id: "a", time: decodeNow.Add(-time.Hour + time.Microsecond),
			src: func(s *config.Source) { s.EventTimeFallback = config.FallbackRecordTimestamp },
			rec: func(r *kgo.Record) { r.Timestamp = decodeNow.Add(-time.Hour + 1500*time.Nanosecond) }},
		{name: "both fallbacks", val: `{}`, id: "events/3/42", time: decodeNow.Add(-time.Minute),
			src: func(s *config.Source) {
				s.EventIDFallback = config.FallbackCoordinates
				s.EventTimeFallback = config.FallbackRecordTimestamp
			}},
		{name: "only fallbacks, no pointers", val: `[1,2,3]`, id: "events/3/42", time: decodeNow.Add(-time.Minute),
			src: func(s *config.Source) {
				s.EventID, s.EventIDFallback = "", config.FallbackCoordinates
				s.EventTime, s.EventTimeFallback = "", config.FallbackRecordTimestamp
			}},

		// time_out_of_range: [now - max_age, now + max_future_skew].
		{name: "older than max_age", val: doc(`"a"`, `"2026-07-07T09:14:59Z"`), reason: ReasonTimeOutOfRange},
		{name: "1µs older than max_age", val: doc(`"a"`, `"2026-07-07T09:14:59.999999Z"`), reason: ReasonTimeOutOfRange},
		{name: "exactly max_age old", val: doc(`"a"`, `"2026-07-07T09:15:00Z"`), id: "a", time: decodeNow.Add(-90 * 24 * time.Hour)},
		{name: "far in the past", val: doc(`"a"`, `"1970-01-01T00:00:00Z"`), reason: ReasonTimeOutOfRange},
		{name: "beyond max_future_skew", val: doc(`"a"`, `"2026-10-05T10:15:01Z"`), reason: ReasonTimeOutOfRange},
		{name: "1µs beyond max_future_skew", val: doc(`"a"`, `"2026-10-05T10:15:00.000001Z"`), reason: ReasonTimeOutOfRange},
		{name: "exactly max_future_skew ahead", val: doc(`"a"`, `"2026-10-05T10:15:00Z"`), id: "a", time: decodeNow.Add(time.Hour)},
		{name: "exactly now", val: doc(`"a"`, `"2026-10-05T09:15:00Z"`), id: "a", time: decodeNow},
		{name: "far in the future", val: doc(`"a"`, `"9999-12-31T23:59:59Z"`), reason: ReasonTimeOutOfRange},
		{name: "unix seconds too old", val: doc(`"a"`, fmt.Sprint(unixNow-90*24*3600-1)), reason: ReasonTimeOutOfRange},
		{name: "unix seconds too new", val: doc(`"a"`, fmt.Sprint(unixNow+3601)), reason: ReasonTimeOutOfRange},
		{name: "zero unix seconds", val: doc(`"a"`, `0`), reason: ReasonTimeOutOfRange},
		{name: "short max_age", val: doc(`"a"`, `"2026-10-05T09:14:00Z"`), reason: ReasonTimeOutOfRange,
			src: func(s *config.Source) { s.MaxAge = config.Duration(30 * time.Second) }},
		{name: "zero max_future_skew", val: doc(`"a"`, `"2026-10-05T09:15:00.000001Z"`), reason: ReasonTimeOutOfRange,
			src: func(s *config.Source) { s.MaxFutureSkew = 0 }},
		{name: "zero max_future_skew, now", val: doc(`"a"`, `"2026-10-05T09:15:00Z"`), id: "a", time: decodeNow,
			src: func(s *config.Source) { s.MaxFutureSkew = 0 }},
		{name: "zone offset counts in range check", val: doc(`"a"`, `"2026-10-05T11:15:00+01:00"`), id: "a", time: decodeNow.Add(time.Hour)},
		{name: "zone offset beyond range", val: doc(`"a"`, `"2026-10-05T10:15:01-00:00"`), reason: ReasonTimeOutOfRange},

		// Time formats: auto.
		{name: "auto rfc3339", val: doc(`"a"`, goodTS), id: "a", time: goodTime},
		{name: "auto rfc3339 with offset", val: doc(`"a"`, `"2026-10-05T11:00:00+02:00"`), id: "a", time: goodTime},
		{name: "auto rfc3339 escaped", val: doc(`"a"`, `"2026-10-05T09:00:00\u005a"`), id: "a", time: goodTime},
		{name: "auto rfc3339 fraction", val: doc(`"a"`, `"2026-10-05T09:00:00.25Z"`), id: "a", time: goodTime.Add(250 * time.Millisecond)},
		{name: "auto unix seconds", val: doc(`"a"`, fmt.Sprint(unixNow)), id: "a", time: decodeNow},
		{name: "auto fractional seconds", val: doc(`"a"`, fmt.Sprintf("%d.5", unixNow)), id: "a", time: decodeNow.Add(500 * time.Millisecond)},
		{name: "auto microsecond seconds", val: doc(`"a"`, fmt.Sprintf("%d.000125", unixNow)), id: "a", time: decodeNow.Add(125 * time.Microsecond)},
		{name: "auto seconds with exponent", val: doc(`"a"`, `1.7911917e9`), id: "a", time: decodeNow},
		{name: "auto unix millis", val: doc(`"a"`, fmt.Sprint(unixNow*1000+123)), id: "a", time: decodeNow.Add(123 * time.Millisecond)},
		{name: "auto fractional millis", val: doc(`"a"`, fmt.Sprintf("%d.5", unixNow*1000)), id: "a", time: decodeNow.Add(500 * time.Microsecond)},
		{name: "auto just below 1e11 is seconds", val: doc(`"a"`, `99999999999`), id: "a",
			now: time.Unix(99999999999, 0), time: time.Unix(99999999999, 0)},
		{name: "auto 1e11 is millis", val: doc(`"a"`, `100000000000`), id: "a",
			now: time.Unix(100000000, 0), time: time.Unix(100000000, 0)},
		{name: "auto 1e11 written with exponent is millis", val: doc(`"a"`, `1e11`), id: "a",
			now: time.Unix(100000000, 0), time: time.Unix(100000000, 0)},
		{name: "auto -1e11 is millis", val: doc(`"a"`, `-100000000000`), id: "a",
			now: time.Unix(-100000000, 0), time: time.Unix(-100000000, 0)},
		{name: "auto negative seconds", val: doc(`"a"`, `-99999999999`), id: "a",
			now: time.Unix(-99999999999, 0), time: time.Unix(-99999999999, 0)},

		// Time formats: rfc3339, unix_seconds, unix_millis.
		{name: "rfc3339", val: doc(`"a"`, goodTS), id: "a", time: goodTime,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeRFC3339 }},
		{name: "unix_seconds", val: doc(`"a"`, fmt.Sprint(unixNow)), id: "a", time: decodeNow,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "unix_seconds fractional", val: doc(`"a"`, fmt.Sprintf("%d.25", unixNow)), id: "a", time: decodeNow.Add(250 * time.Millisecond),
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "unix_seconds never switches to millis", val: doc(`"a"`, `100000000000`), id: "a",
			now: time.Unix(100000000000, 0), time: time.Unix(100000000000, 0),
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "unix_seconds millis value is far future", val: doc(`"a"`, fmt.Sprint(unixNow*1000)), reason: ReasonTimeOutOfRange,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "unix_millis", val: doc(`"a"`, fmt.Sprint(unixNow*1000+7)), id: "a", time: decodeNow.Add(7 * time.Millisecond),
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
		{name: "unix_millis fractional", val: doc(`"a"`, fmt.Sprintf("%d.001", unixNow*1000)), id: "a", time: decodeNow.Add(time.Microsecond),
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
		{name: "unix_millis never switches to seconds", val: doc(`"a"`, `1000`), id: "a",
			now: time.Unix(1, 0), time: time.Unix(1, 0),
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
		{name: "unix_millis seconds value is far past", val: doc(`"a"`, fmt.Sprint(unixNow)), reason: ReasonTimeOutOfRange,
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},

		// Microseconds, truncated: an event stays on the day it names.
		{name: "nanoseconds truncated", val: doc(`"a"`, `"2026-10-05T09:00:00.123456499Z"`), id: "a", time: goodTime.Add(123456 * time.Microsecond)},
		{name: "half a microsecond truncated", val: doc(`"a"`, `"2026-10-05T09:00:00.1234565Z"`), id: "a", time: goodTime.Add(123456 * time.Microsecond)},
		{name: "the last nanoseconds of a day stay in it", val: doc(`"a"`, `"2025-06-30T23:59:59.9999996Z"`), id: "a",
			now: lastMicro, time: lastMicro},
		{name: "the last nanoseconds of a day in another zone", val: doc(`"a"`, `"2025-07-01T01:59:59.9999999+02:00"`), id: "a",
			now: lastMicro, time: lastMicro},
		{name: "sub-microsecond seconds truncated", val: doc(`"a"`, fmt.Sprintf("%d.0000016", unixNow-60)), id: "a", time: decodeNow.Add(-time.Minute + time.Microsecond)},
		{name: "sub-microsecond millis truncated", val: doc(`"a"`, fmt.Sprintf("%d.0016", unixNow*1000)), id: "a", time: decodeNow.Add(time.Microsecond)},
		{name: "the last seconds of a day stay in it", val: doc(`"a"`, `1751327999.9999996`), id: "a", now: lastMicro, time: lastMicro},
		{name: "the last millis of a day stay in it", val: doc(`"a"`, `1751327999999.9999`), id: "a", now: lastMicro, time: lastMicro},
		{name: "the last seconds with an exponent", val: doc(`"a"`, `17513279999999996e-7`), id: "a", now: lastMicro, time: lastMicro},
		{name: "a microsecond after midnight is kept", val: doc(`"a"`, `1751328000.000001`), id: "a",
			now: lastMicro, time: lastMicro.Add(2 * time.Microsecond)},
		{name: "before 1970, toward the past", val: doc(`"a"`, `-0.0000005`), id: "a",
			now: time.Unix(0, 0), time: time.Unix(0, -1000)},
		{name: "before 1970, exact", val: doc(`"a"`, `-1.5e-5`), id: "a", now: time.Unix(0, 0), time: time.Unix(0, -15000)},
		{name: "zero with a large exponent", val: doc(`"a"`, `0e999999999`), id: "a", now: time.Unix(0, 0), time: time.Unix(0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := testSource()
			if tt.src != nil {
				tt.src(src)
			}
			d := newTestDecoder(t, src)
			r := record(tt.val)
			if tt.rec != nil {
				tt.rec(r)
			}
			orig := bytes.Clone(r.Value)
			now := tt.now
			if now.IsZero() {
				now = decodeNow
			}
			ev, rej := d.Decode(r, now)
			if !bytes.Equal(r.Value, orig) {
				t.Errorf("Decode changed the record value to %q", r.Value)
			}
			if tt.reason != "" {
				if rej == nil {
					t.Fatalf("Decode(%.80q) = %+v, want rejection %s", tt.val, ev, tt.reason)
				}
				if rej.Reason != tt.reason {
					t.Errorf("Decode(%.80q) reason = %s (%s), want %s", tt.val, rej.Reason, rej.Detail, tt.reason)
				}
				if rej.Detail == "" {
					t.Errorf("Decode(%.80q): rejection %s has no detail", tt.val, rej.Reason)
				}
				if ev.ID != "" || !ev.Time.IsZero() || ev.Payload != nil {
					t.Errorf("Decode(%.80q): rejected, but event = %+v", tt.val, ev)
				}
				return
			}
			if rej != nil {
				t.Fatalf("Decode(%.80q) rejected: %s: %s", tt.val, rej.Reason, rej.Detail)
			}
			if ev.ID != tt.id {
				t.Errorf("ID = %.80q, want %.80q", ev.ID, tt.id)
			}
			if !ev.Time.Equal(tt.time) {
				t.Errorf("Time = %s, want %s", ev.Time.UTC().Format(time.RFC3339Nano), tt.time.UTC().Format(time.RFC3339Nano))
			}
			if ev.Time.Nanosecond()%1000 != 0 {
				t.Errorf("Time %s is not a whole microsecond", ev.Time.Format(time.RFC3339Nano))
			}
			if !bytes.Equal(ev.Payload, r.Value) {
				t.Errorf("Payload = %q, want the record value %q", ev.Payload, r.Value)
			}
		})
	}
}

// TestDecodeRejectionDetail checks that details say where and what.
func TestDecodeRejectionDetail(t *testing.T) {
	tests := []struct {
		name   string
		src    func(*config.Source)
		val    string
		reason string
		detail []string // substrings
	}{
		{name: "empty value", val: "", reason: ReasonInvalidJSON, detail: []string{"empty"}},
		{name: "missing id names the pointer", val: doc("", goodTS), reason: ReasonMissingID, detail: []string{"/id"}},
		{name: "missing nested id names the pointer", val: `{"ts":"2026-10-05T09:00:00Z"}`, reason: ReasonMissingID, detail: []string{"/meta/id"},
			src: func(s *config.Source) { s.EventID = "/meta/id" }},
		{name: "missing time names the pointer", val: doc(`"a"`, ""), reason: ReasonMissingTime, detail: []string{"/ts"}},
		{name: "long id", val: doc(`"`+strings.Repeat("x", 600)+`"`, goodTS), reason: ReasonInvalidID, detail: []string{"600", "512"}},
		{name: "too old", val: doc(`"a"`, `"2026-01-01T00:00:00Z"`), reason: ReasonTimeOutOfRange, detail: []string{"max_age", "2026-01-01T00:00:00Z"}},
		{name: "too new", val: doc(`"a"`, `"2026-10-06T00:00:00Z"`), reason: ReasonTimeOutOfRange, detail: []string{"max_future_skew", "2026-10-06T00:00:00Z"}},
		{name: "far future unix seconds is not called old", val: doc(`"a"`, `1e15`), reason: ReasonTimeOutOfRange, detail: []string{"9999"},
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixSeconds }},
		{name: "far future unix millis is not called old", val: doc(`"a"`, `9.5e15`), reason: ReasonTimeOutOfRange, detail: []string{"9999"},
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
		{name: "wrong format names it", val: doc(`"a"`, goodTS), reason: ReasonInvalidTime, detail: []string{"unix_millis"},
			src: func(s *config.Source) { s.EventTimeFormat = config.TimeUnixMillis }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := testSource()
			if tt.src != nil {
				tt.src(src)
			}
			_, rej := newTestDecoder(t, src).Decode(record(tt.val), decodeNow)
			if rej == nil {
				t.Fatalf("Decode(%.60q) accepted, want %s", tt.val, tt.reason)
			}
			if rej.Reason != tt.reason {
				t.Fatalf("reason = %s (%s), want %s", rej.Reason, rej.Detail, tt.reason)
			}
			for _, s := range tt.detail {
				if !strings.Contains(rej.Detail, s) {
					t.Errorf("detail %q does not mention %q", rej.Detail, s)
				}
			}
		})
	}
}

// TestDecodeReusesDecoder checks that one decoder carries nothing from one
// record to the next.
func TestDecodeReusesDecoder(t *testing.T) {
	d := newTestDecoder(t, testSource())
	ev, rej := d.Decode(record(doc(`"first"`, goodTS)), decodeNow)
	if rej != nil || ev.ID != "first" {
		t.Fatalf("first record: %+v, %+v", ev, rej)
	}
	if _, rej := d.Decode(record(doc("", goodTS)), decodeNow); rej == nil || rej.Reason != ReasonMissingID {
		t.Errorf("second record without id: %+v, want %s", rej, ReasonMissingID)
	}
	if _, rej := d.Decode(record(doc(`"third"`, "")), decodeNow); rej == nil || rej.Reason != ReasonMissingTime {
		t.Errorf("third record without time: %+v, want %s", rej, ReasonMissingTime)
	}
}

// TestDecodePayloadIsValue checks that the payload is the record's own
// bytes, not a re-encoding.
func TestDecodePayloadIsValue(t *testing.T) {
	val := "{ \"ts\" : \"2026-10-05T09:00:00Z\",\n  \"id\":\"a\", \"x\": 1.50E+2, \"k\":\"\\u00e9\", \"k\":2 }"
	r := record(val)
	ev, rej := newTestDecoder(t, testSource()).Decode(r, decodeNow)
	if rej != nil {
		t.Fatalf("rejected: %+v", rej)
	}
	if string(ev.Payload) != val {
		t.Errorf("Payload = %q, want %q", ev.Payload, val)
	}
	if len(ev.Payload) > 0 && &ev.Payload[0] != &r.Value[0] {
		t.Errorf("Payload is a copy of the record value, want the value itself")
	}
}

func TestNewDecoder(t *testing.T) {
	tests := []struct {
		name string
		src  func(*config.Source)
		bad  bool
		ptrs []string
	}{
		{name: "both pointers", ptrs: []string{"/id", "/ts"}},
		{name: "id by fallback", ptrs: []string{"/ts"},
			src: func(s *config.Source) { s.EventID, s.EventIDFallback = "", config.FallbackCoordinates }},
		{name: "time by fallback", ptrs: []string{"/id"},
			src: func(s *config.Source) { s.EventTime, s.EventTimeFallback = "", config.FallbackRecordTimestamp }},
		{name: "no pointers",
			src: func(s *config.Source) {
				s.EventID, s.EventIDFallback = "", config.FallbackCoordinates
				s.EventTime, s.EventTimeFallback = "", config.FallbackRecordTimestamp
			}},
		{name: "same pointer twice", ptrs: []string{"/x", "/x"},
			src: func(s *config.Source) { s.EventID, s.EventTime = "/x", "/x" }},
		{name: "bad id pointer", bad: true, src: func(s *config.Source) { s.EventID = "id" }},
		{name: "bad id pointer escape", bad: true, src: func(s *config.Source) { s.EventID = "/a~2" }},
		{name: "bad time pointer", bad: true, src: func(s *config.Source) { s.EventTime = "ts" }},
		{name: "bad time pointer escape", bad: true, src: func(s *config.Source) { s.EventTime = "/ts~" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := testSource()
			if tt.src != nil {
				tt.src(src)
			}
			d, err := NewDecoder(src)
			if tt.bad {
				if err == nil {
					t.Fatalf("NewDecoder = %+v, want an error", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewDecoder: %v", err)
			}
			var got []string
			for _, p := range d.ptrs {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.ptrs) {
				t.Errorf("pointers = %q, want %q", got, tt.ptrs)
			}
		})
	}
}

// A decoder with the same pointer for id and time reads both from it.
func TestDecodeSamePointer(t *testing.T) {
	src := testSource()
	src.EventID, src.EventTime = "/x", "/x"
	src.EventTimeFormat = config.TimeUnixSeconds
	ev, rej := newTestDecoder(t, src).Decode(record(fmt.Sprintf(`{"x":%d}`, decodeNow.Unix())), decodeNow)
	if rej != nil {
		t.Fatalf("rejected: %+v", rej)
	}
	if ev.ID != fmt.Sprint(decodeNow.Unix()) || !ev.Time.Equal(decodeNow) {
		t.Errorf("event = %+v", ev)
	}
}

func TestDecodeReasonNames(t *testing.T) {
	want := map[string]string{
		ReasonInvalidJSON:     "invalid_json",
		ReasonMissingID:       "missing_id",
		ReasonInvalidID:       "invalid_id",
		ReasonMissingTime:     "missing_time",
		ReasonInvalidTime:     "invalid_time",
		ReasonTimeOutOfRange:  "time_out_of_range",
		ReasonRejectedByStore: "rejected",
		ReasonWrongFormat:     "wrong_format",
		ReasonUnknownSchema:   "unknown_schema",
		ReasonInvalidSchema:   "invalid_schema",
		ReasonSchemaMismatch:  "schema_mismatch",
		ReasonDecodeLimit:     "decode_limit",
		ReasonInvalidEnvelope: "invalid_envelope",
		ReasonMissingKey:      "missing_key",
		ReasonWrongTable:      "wrong_table",
	}
	if len(Reasons) != len(want) {
		t.Errorf("Reasons has %d entries, want %d", len(Reasons), len(want))
	}
	seen := map[string]bool{}
	for _, r := range Reasons {
		if _, ok := want[r]; !ok {
			t.Errorf("Reasons holds unexpected %q", r)
		}
		if seen[r] {
			t.Errorf("Reasons holds %q twice", r)
		}
		seen[r] = true
	}
	for c, s := range want {
		if c != s {
			t.Errorf("constant %q, want %q (reasons are stable)", c, s)
		}
	}
}

// TestTimeFallbackForNull checks that event_time_fallback takes the
// record timestamp for a null event time in every format: a null Avro
// union, an unset Protobuf Timestamp, a JSON null; and that without the
// fallback such a record is missing_time.
func TestTimeFallbackForNull(t *testing.T) {
	const avroSchema = `{"type":"record","name":"E","fields":[{"name":"event_id","type":"string"},
		{"name":"event_time","type":["null",{"type":"long","logicalType":"timestamp-millis"}]}]}`
	const protoSchema = `syntax = "proto3";
import "google/protobuf/timestamp.proto";
message E { string event_id = 1; google.protobuf.Timestamp event_time = 2; }`
	g := srtest.New(t)
	avroID := g.Register("avro-value", sr.Schema{Schema: avroSchema})
	protoID := g.Register("proto-value", sr.Schema{Schema: protoSchema, Type: sr.TypeProtobuf})
	reg, err := NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	at := decodeNow.Add(-time.Minute)
	// A Protobuf E whose event_id is "p" and event_time unset.
	protoValue := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(protoID)), 0, 0x0a, 0x01, 'p')
	tests := []struct {
		name, format string
		value        []byte
		id           string
	}{
		{"avro null union", config.FormatAvro, srtest.AvroEncoder(t, avroID, avroSchema)(map[string]any{"event_id": "a", "event_time": nil}), "a"},
		{"protobuf unset Timestamp", config.FormatProtobuf, protoValue, "p"},
		{"json null", config.FormatJSON, []byte(`{"event_id": "j", "event_time": null}`), "j"},
	}
	for _, tt := range tests {
		for _, fallback := range []string{config.FallbackRecordTimestamp, ""} {
			t.Run(tt.name+" "+cmp.Or(fallback, "no fallback"), func(t *testing.T) {
				src := testSource()
				src.Format, src.EventID, src.EventTime, src.EventTimeFallback = tt.format, "/event_id", "/event_time", fallback
				var r *Registry
				if config.UsesRegistry(tt.format) {
					r = reg
				}
				d, err := NewRegistryDecoder(src, r)
				if err != nil {
					t.Fatal(err)
				}
				rec := &kgo.Record{Topic: "events", Value: tt.value, Timestamp: at}
				s, err := d.Resolve(context.Background(), []*kgo.Record{rec})
				if err != nil {
					t.Fatal(err)
				}
				ev, rej := d.DecodeWith(rec, decodeNow, s)
				switch {
				case fallback == "" && (rej == nil || rej.Reason != ReasonMissingTime || !strings.Contains(rej.Detail, "null at /event_time")):
					t.Errorf("got %+v, %+v; want missing_time", ev, rej)
				case fallback != "" && (rej != nil || ev.ID != tt.id || !ev.Time.Equal(at)):
					t.Errorf("got %+v, %+v; want %s at the record timestamp %s", ev, rej, tt.id, at)
				}
			})
		}
	}
}
