package decode

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
)

// dbzSource is a Debezium source as config.Parse leaves it.
func dbzSource() *config.Source {
	return &config.Source{Kafka: &config.KafkaSource{Topics: []string{"pg.public.customers"}}, Format: config.FormatDebezium,
		Mirror: &config.Mirror{Table: "dw.customers"}, Name: "customers"}
}

// pgCreateWithSchema is the PostgreSQL connector's create event of its
// documentation (inventory.customers), as the JSON converter writes it
// with schemas.enable.
const pgCreateWithSchema = `{
  "schema": {"type": "struct", "name": "PostgreSQL_server.inventory.customers.Envelope", "optional": false, "fields": [
    {"type": "struct", "name": "PostgreSQL_server.inventory.customers.Value", "optional": true, "field": "before", "fields": [
      {"type": "int32", "optional": false, "field": "id"},
      {"type": "string", "optional": false, "field": "first_name"},
      {"type": "string", "optional": false, "field": "last_name"},
      {"type": "string", "optional": false, "field": "email"}]},
    {"type": "struct", "name": "PostgreSQL_server.inventory.customers.Value", "optional": true, "field": "after", "fields": [
      {"type": "int32", "optional": false, "field": "id"},
      {"type": "string", "optional": false, "field": "first_name"},
      {"type": "string", "optional": false, "field": "last_name"},
      {"type": "string", "optional": false, "field": "email"}]},
    {"type": "struct", "name": "io.debezium.connector.postgresql.Source", "optional": false, "field": "source", "fields": [
      {"type": "string", "optional": false, "field": "version"},
      {"type": "string", "optional": false, "field": "connector"},
      {"type": "string", "optional": false, "field": "name"},
      {"type": "int64", "optional": false, "field": "ts_ms"},
      {"type": "string", "optional": true, "name": "io.debezium.data.Enum", "field": "snapshot"},
      {"type": "string", "optional": false, "field": "db"},
      {"type": "string", "optional": true, "field": "sequence"},
      {"type": "string", "optional": false, "field": "schema"},
      {"type": "string", "optional": false, "field": "table"},
      {"type": "int64", "optional": true, "field": "txId"},
      {"type": "int64", "optional": true, "field": "lsn"},
      {"type": "int64", "optional": true, "field": "xmin"}]},
    {"type": "string", "optional": false, "field": "op"},
    {"type": "int64", "optional": true, "field": "ts_ms"}]},
  "payload": {
    "before": null,
    "after": {"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
    "source": {"version": "2.5.4.Final", "connector": "postgresql", "name": "PostgreSQL_server", "ts_ms": 1559033904863,
      "snapshot": "false", "db": "postgres", "sequence": "[\"24023119\",\"24023128\"]", "schema": "public",
      "table": "customers", "txId": 555, "lsn": 24023128, "xmin": null},
    "op": "c",
    "ts_ms": 1559033904863}}`

const pgKeyWithSchema = `{"schema": {"type": "struct", "name": "PostgreSQL_server.inventory.customers.Key", "optional": false,
  "fields": [{"type": "int32", "optional": false, "field": "id"}]}, "payload": {"id": 1}}`

// mysqlUpdate is the MySQL connector's update event of its documentation,
// without schemas.
const mysqlUpdate = `{
  "before": {"id": 1004, "first_name": "Anne Marie", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
  "after": {"id": 1004, "first_name": "Anne Marie", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
  "source": {"version": "2.5.4.Final", "name": "mysql-server-1", "connector": "mysql", "ts_ms": 1465581029000,
    "snapshot": "false", "db": "inventory", "table": "customers", "server_id": 223344, "gtid": null,
    "file": "mysql-bin.000003", "pos": 484, "row": 0, "thread": 7, "query": null},
  "op": "u",
  "ts_ms": 1465581029523}`

func dbzRecord(key, value string) *kgo.Record {
	r := &kgo.Record{Topic: "pg.public.customers", Partition: 0, Offset: 7}
	if key != "" {
		r.Key = []byte(key)
	}
	if value != "" {
		r.Value = []byte(value)
	}
	return r
}

func decodeChange(t *testing.T, key, value string) (Event, *Rejection) {
	t.Helper()
	d, err := NewDecoder(dbzSource())
	if err != nil {
		t.Fatal(err)
	}
	return d.Decode(dbzRecord(key, value), time.Time{})
}

func jsonEqual(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v in %s", what, err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: want: %v", what, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s = %s, want %s", what, got, want)
	}
}

// TestDebeziumEnvelopes decodes the connectors' documented events: the
// change, its position, event id and time, both converters.
func TestDebeziumEnvelopes(t *testing.T) {
	t.Run("postgresql create with schemas", func(t *testing.T) {
		ev, rej := decodeChange(t, pgKeyWithSchema, pgCreateWithSchema)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		c := ev.Change
		if c.Op != OpInsert || c.Snapshot || c.Table != "public.customers" || c.LSN != "0/16E9058" {
			t.Errorf("change = %+v", c)
		}
		if want := []int64{phaseStream, 24023119, 24023128}; !slices.Equal(c.Position, want) {
			t.Errorf("position = %v, want %v", c.Position, want)
		}
		if want := time.UnixMilli(1559033904863).UTC(); !ev.Time.Equal(want) {
			t.Errorf("time = %s, want %s", ev.Time, want)
		}
		if ev.ID != "1.24023119.24023128/insert/public.customers/1" || c.RowKey != "1" {
			t.Errorf("id = %q, row key %q", ev.ID, c.RowKey)
		}
		jsonEqual(t, "row", c.Row, `{"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}`)
		if len(c.Columns) != 4 || c.Columns[0] != (Column{Name: "id", Type: "integer", NotNull: true}) || !slices.Equal(c.KeyColumns, []string{"id"}) {
			t.Errorf("columns = %v, key %v", c.Columns, c.KeyColumns)
		}
	})
	t.Run("mysql update without schemas", func(t *testing.T) {
		ev, rej := decodeChange(t, `{"id": 1004}`, mysqlUpdate)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		c := ev.Change
		if c.Op != OpUpdate || c.Table != "inventory.customers" || c.Columns != nil || c.Old == nil {
			t.Errorf("change = %+v", c)
		}
		if want := []int64{3, 484, phaseStream, 0}; !slices.Equal(c.Position, want) {
			t.Errorf("position = %v, want %v", c.Position, want)
		}
	})
	t.Run("snapshot read orders before a streamed change at its place", func(t *testing.T) {
		read := strings.Replace(strings.Replace(mysqlUpdate, `"op": "u"`, `"op": "r"`, 1), `"snapshot": "false"`, `"snapshot": "last"`, 1)
		ev, rej := decodeChange(t, `{"id": 1004}`, read)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		if !ev.Change.Snapshot || ev.Change.Op != OpInsert || !slices.Equal(ev.Change.Position, []int64{3, 484, phaseSnapshot, 0}) {
			t.Errorf("change = %+v", ev.Change)
		}
	})
	t.Run("tombstone", func(t *testing.T) {
		ev, rej := decodeChange(t, `{"id": 1004}`, "")
		if rej != nil || ev.Skip != SkipTombstone {
			t.Errorf("got %+v, %+v; want a skipped tombstone", ev, rej)
		}
	})
	t.Run("truncate", func(t *testing.T) {
		trunc := `{"before": null, "after": null, "op": "t", "ts_ms": 1559033904999,
			"source": {"connector": "postgresql", "ts_ms": 1559033904990, "schema": "public", "table": "customers", "lsn": 24100000,
			"sequence": "[\"24099000\",\"24100000\"]", "snapshot": "false"}}`
		ev, rej := decodeChange(t, "", trunc)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		if ev.Change.Op != OpTruncate || ev.ID != "1.24099000.24100000/truncate/public.customers" || string(ev.Payload) != "{}" {
			t.Errorf("event = %q %+v", ev.ID, ev.Change)
		}
	})
	t.Run("delete keeps the key from before", func(t *testing.T) {
		del := `{"before": {"id": 1, "first_name": null, "last_name": null, "email": null}, "after": null, "op": "d",
			"source": {"connector": "postgresql", "ts_ms": 1559033905000, "schema": "public", "table": "customers", "lsn": 24200000}}`
		ev, rej := decodeChange(t, `{"id": 1}`, del)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		if ev.Change.Op != OpDelete || !slices.Equal(ev.Change.Position, []int64{phaseStream, 24200000, 24200000}) {
			t.Errorf("change = %+v", ev.Change)
		}
	})
	t.Run("flattened", func(t *testing.T) {
		flat := `{"id": 7, "name": "x", "__op": "d", "__deleted": "true", "__lsn": 5000, "__source_ts_ms": 1700000000000, "__table": "items", "__source_schema": "shop"}`
		ev, rej := decodeChange(t, `{"id": 7}`, flat)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		c := ev.Change
		if c.Op != OpDelete || c.Table != "shop.items" || !slices.Equal(c.Position, []int64{phaseStream, 5000, 5000}) {
			t.Errorf("change = %+v", c)
		}
		jsonEqual(t, "row", c.Row, `{"id": 7, "name": "x"}`)
	})
}

// TestDebeziumRejections: what is not a change tidemark can apply is a
// dead letter with its reason.
func TestDebeziumRejections(t *testing.T) {
	tests := []struct {
		name, key, value, reason string
	}{
		{"not JSON", `{"id": 1}`, `{"op": `, ReasonInvalidJSON},
		{"no key", "", mysqlUpdate, ReasonMissingKey},
		{"unknown op", `{"id": 1004}`, strings.Replace(mysqlUpdate, `"op": "u"`, `"op": "m"`, 1), ReasonInvalidEnvelope},
		{"no commit time", `{"id": 1004}`, strings.Replace(mysqlUpdate, `"ts_ms": 1465581029000,`, "", 1), ReasonInvalidEnvelope},
		{"other connector", `{"id": 1004}`, strings.Replace(mysqlUpdate, `"connector": "mysql"`, `"connector": "oracle"`, 1), ReasonInvalidEnvelope},
		{"create without after", `{"id": 1}`, `{"op": "c", "after": null, "source": {"connector": "postgresql", "ts_ms": 1, "lsn": 1}}`, ReasonInvalidEnvelope},
		{"flattened without position", `{"id": 1}`, `{"id": 1, "__op": "c", "__source_ts_ms": 1}`, ReasonInvalidEnvelope},
		{"bad decimal", `{"id": 1}`, `{"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
			{"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}]}]},
			"payload": {"op": "c", "after": {"id": 1, "amount": "!!"}, "source": {"connector": "postgresql", "ts_ms": 1, "lsn": 1}}}`, ReasonInvalidEnvelope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, rej := decodeChange(t, tt.key, tt.value)
			if rej == nil || rej.Reason != tt.reason {
				t.Errorf("rejection = %+v, want reason %s", rej, tt.reason)
			}
		})
	}
	t.Run("mirror key not in the row", func(t *testing.T) {
		d, err := NewDecoder(dbzSource())
		if err != nil {
			t.Fatal(err)
		}
		d.SetMirrorKey([]string{"tenant", "id"})
		if _, rej := d.Decode(dbzRecord(`{"id": 1004}`, mysqlUpdate), time.Time{}); rej == nil || rej.Reason != ReasonMissingKey {
			t.Errorf("rejection = %+v, want missing_key", rej)
		}
	})
}

// TestDebeziumLogicalTypes decodes each logical type with its schema to
// the value PostgreSQL reads, and keeps unavailable values out.
func TestDebeziumLogicalTypes(t *testing.T) {
	b64 := func(b ...byte) string { return base64.StdEncoding.EncodeToString(b) }
	tests := []struct {
		schema, value, want, pgType string
	}{
		{`{"type": "int32", "name": "io.debezium.time.Date"}`, `19723`, `"2024-01-01"`, "date"},
		{`{"type": "int32", "name": "org.apache.kafka.connect.data.Date"}`, `-1`, `"1969-12-31"`, "date"},
		{`{"type": "int32", "name": "io.debezium.time.Time"}`, `45296789`, `"12:34:56.789"`, "time"},
		{`{"type": "int64", "name": "io.debezium.time.MicroTime"}`, `45296000001`, `"12:34:56.000001"`, "time"},
		{`{"type": "int64", "name": "io.debezium.time.NanoTime"}`, `45296000000000`, `"12:34:56"`, "time"},
		{`{"type": "int64", "name": "io.debezium.time.Timestamp"}`, `1704067200123`, `"2024-01-01T00:00:00.123Z"`, "timestamp"},
		{`{"type": "int64", "name": "io.debezium.time.MicroTimestamp"}`, `1704067200123456`, `"2024-01-01T00:00:00.123456Z"`, "timestamp"},
		{`{"type": "int64", "name": "io.debezium.time.NanoTimestamp"}`, `1704067200123456789`, `"2024-01-01T00:00:00.123456Z"`, "timestamp"},
		{`{"type": "int64", "name": "io.debezium.time.NanoTimestamp"}`, `1751327999999999600`, `"2025-06-30T23:59:59.999999Z"`, "timestamp"},
		{`{"type": "int64", "name": "io.debezium.time.NanoTimestamp"}`, `-400`, `"1969-12-31T23:59:59.999999Z"`, "timestamp"},
		{`{"type": "int64", "name": "io.debezium.time.NanoTime"}`, `86399999999600`, `"23:59:59.999999"`, "time"},
		{`{"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}`, `0`, `"1970-01-01T00:00:00Z"`, "timestamp"},
		{`{"type": "string", "name": "io.debezium.time.ZonedTimestamp"}`, `"2024-01-01T10:00:00+02:00"`, `"2024-01-01T10:00:00+02:00"`, "timestamptz"},
		{`{"type": "string", "name": "io.debezium.time.ZonedTime"}`, `"10:00:00Z"`, `"10:00:00Z"`, "timetz"},
		{`{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}`, `"` + b64(0x04, 0xD2) + `"`, `12.34`, "numeric"},
		{`{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "3"}}`, `"` + b64(0xFF, 0x85) + `"`, `-0.123`, "numeric"},
		{`{"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}`, `{"scale": 1, "value": "` + b64(0x01, 0x00) + `"}`, `25.6`, "numeric"},
		{`{"type": "int64", "name": "io.debezium.time.MicroDuration"}`, `90000000`, `"90000000 microseconds"`, "interval"},
		{`{"type": "string", "name": "io.debezium.data.Json"}`, `"{\"a\": [1, 2]}"`, `{"a": [1, 2]}`, "jsonb"},
		{`{"type": "bytes"}`, `"` + b64(0xDE, 0xAD) + `"`, `"\\xdead"`, "bytea"},
		{`{"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}`, `[0, 1]`, `["1970-01-01", "1970-01-02"]`, "date[]"},
		{`{"type": "string", "name": "io.debezium.data.Uuid"}`, `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, "uuid"},
	}
	for _, tt := range tests {
		t.Run(tt.schema, func(t *testing.T) {
			var s connectSchema
			if err := json.Unmarshal([]byte(tt.schema), &s); err != nil {
				t.Fatal(err)
			}
			got, err := convert(json.RawMessage(tt.value), &s, newBudget(config.DecodeLimits{}, len(tt.value)))
			if err != nil {
				t.Fatalf("convert(%s): %v", tt.value, err)
			}
			jsonEqual(t, "value", got, tt.want)
			if typ := pgType(&s); typ != tt.pgType {
				t.Errorf("type = %s, want %s", typ, tt.pgType)
			}
		})
	}
	t.Run("values already decoded are kept", func(t *testing.T) {
		for _, tt := range []struct{ schema, value string }{
			{`{"type": "int32", "name": "io.debezium.time.Date"}`, `"2024-01-01"`},
			{`{"type": "int64", "name": "io.debezium.time.MicroTimestamp"}`, `"2024-01-01T00:00:00.123456Z"`},
			{`{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}`, `-12.34`},
		} {
			var s connectSchema
			if err := json.Unmarshal([]byte(tt.schema), &s); err != nil {
				t.Fatal(err)
			}
			if got, err := convert(json.RawMessage(tt.value), &s, newBudget(config.DecodeLimits{}, len(tt.value))); err != nil || string(got) != tt.value {
				t.Errorf("convert(%s) = %s, %v; want it kept", tt.value, got, err)
			}
		}
	})
	t.Run("unavailable values are left out", func(t *testing.T) {
		upd := `{"before": null, "after": {"id": 1, "bio": "__debezium_unavailable_value", "tags": ["__debezium_unavailable_value"],
			"blob": "` + unavailableBase64 + `", "name": "n"}, "op": "u",
			"source": {"connector": "postgresql", "ts_ms": 1, "lsn": 10}}`
		ev, rej := decodeChange(t, `{"id": 1}`, upd)
		if rej != nil {
			t.Fatalf("rejected: %+v", rej)
		}
		jsonEqual(t, "row", ev.Change.Row, `{"id": 1, "name": "n"}`)
		if !slices.Equal(ev.Change.Unavailable, []string{"bio", "tags", "blob"}) {
			t.Errorf("unavailable = %v", ev.Change.Unavailable)
		}
	})
}

// TestDebeziumLimits checks that a change whose values convert to more
// than the record's budget, or whose structs nest so deep that reading
// them again costs more than it, is a decode_limit dead letter, having
// allocated a few times the budget at most; and that a decimal of more
// digits than numeric holds is an invalid envelope before it is
// converted.
func TestDebeziumLimits(t *testing.T) {
	decimal := func(scale int) string {
		return `{"field": "amounts", "type": "array", "items": {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
			"parameters": {"scale": "` + strconv.Itoa(scale) + `"}}}`
	}
	change := func(column, value string) string {
		return `{"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [` + column + `]}]},
			"payload": {"op": "c", "after": {"id": 1, ` + value + `}, "source": {"connector": "postgresql", "ts_ms": 1, "lsn": 1}}}`
	}
	nested := func(levels int) (string, string) {
		col := `{"field": "n", "type": "int32"}`
		val := `{"n": 7, "pad": "` + strings.Repeat("x", 50_000) + `"}`
		for range levels {
			col = `{"field": "n", "type": "struct", "fields": [` + col + `]}`
			val = `{"n": ` + val + `}`
		}
		return col, `"n": ` + val
	}
	deepCol, deepVal := nested(100)
	tests := []struct {
		name, value string
		reason      string // "": a change
		want        string
	}{
		{"50,000 decimals of scale 1000", change(decimal(1000), `"amounts": [`+strings.Repeat(`"AA==",`, 49_999)+`"AA=="]`),
			ReasonDecodeLimit, "column amounts: the value decodes to more than its budget of"},
		{"decimals within the budget", change(decimal(1000), `"amounts": ["AQ==", "/w=="]`), "", `"amounts": [0.` + strings.Repeat("0", 999) + `1, -0.` + strings.Repeat("0", 999) + `1]`},
		{"a decimal of a million bytes", change(decimal(2), `"amounts": ["`+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x7f}, 1<<20))+`"]`),
			ReasonInvalidEnvelope, "a decimal of 1048576 bytes has more digits than PostgreSQL's numeric holds"},
		{"structs 100 deep read again", change(deepCol, deepVal), ReasonDecodeLimit, "a struct read again: more than the"},
		{"structs 3 deep", change(`{"field": "n", "type": "struct", "fields": [{"field": "n", "type": "struct", "fields": [{"field": "n", "type": "int32"}]}]}`,
			`"n": {"n": {"n": 7}}`), "", `"n": {"n": {"n": 7}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ev Event
			var rej *Rejection
			n := allocated(func() { ev, rej = decodeChange(t, `{"id": 1}`, tt.value) })
			if bound := allocBound(newBudget(config.DecodeLimits{}, len(tt.value)+len(`{"id": 1}`)).limit); n > bound {
				t.Errorf("allocated %d bytes, more than %d", n, bound)
			}
			switch {
			case tt.reason == "" && rej != nil:
				t.Fatalf("rejected: %.300v", rej)
			case tt.reason == "":
				jsonEqual(t, "row", ev.Change.Row, `{"id": 1, `+tt.want+`}`)
			case rej == nil || rej.Reason != tt.reason || !strings.Contains(rej.Detail, tt.want):
				t.Fatalf("got %.300v, want %s: ...%s...", rej, tt.reason, tt.want)
			}
		})
	}
}

// TestDebeziumTimeOfDayRange: a time of day whose count of units would
// overflow a duration is out of range, not a wrapped-around time.
func TestDebeziumTimeOfDayRange(t *testing.T) {
	s := connectSchema{Type: "int32", Name: dbzTime}
	// 18446744073710 ms is 2^64 ns and 448384 more.
	if got, err := convert(json.RawMessage(`18446744073710`), &s, newBudget(config.DecodeLimits{}, 14)); err == nil {
		t.Errorf("convert = %s, want out of range", got)
	}
}
