package decode

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// compactParts are the schema and payload of pgCreateWithSchema, each
// written compactly.
func compactParts(t testing.TB) (schema, payload string) {
	t.Helper()
	var doc struct{ Schema, Payload json.RawMessage }
	if err := json.Unmarshal([]byte(pgCreateWithSchema), &doc); err != nil {
		t.Fatal(err)
	}
	var s, p bytes.Buffer
	if err := json.Compact(&s, doc.Schema); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&p, doc.Payload); err != nil {
		t.Fatal(err)
	}
	return s.String(), p.String()
}

// decodeCold and decodeWarm decode a record value with pgKeyWithSchema as
// its key: cold with a new decoder, warm with one that decoded a change
// of the same schema in the layout of value first.
func decodeCold(t testing.TB, value string) (Event, *Rejection) {
	t.Helper()
	d, err := NewDecoder(dbzSource())
	if err != nil {
		t.Fatal(err)
	}
	return d.Decode(dbzRecord(pgKeyWithSchema, value), time.Time{})
}

func decodeWarm(t testing.TB, value string) (Event, *Rejection, *Decoder) {
	t.Helper()
	d, err := NewDecoder(dbzSource())
	if err != nil {
		t.Fatal(err)
	}
	schema, payload := compactParts(t)
	warm := `{"schema":` + schema + `,"payload":` + payload + `}`
	if strings.HasPrefix(value, payloadFirst) {
		warm = `{"payload":` + payload + `,"schema":` + schema + `}`
	}
	if _, rej := d.Decode(dbzRecord(pgKeyWithSchema, warm), time.Time{}); rej != nil {
		t.Fatalf("warm-up: %v", rej)
	}
	ev, rej := d.Decode(dbzRecord(pgKeyWithSchema, value), time.Time{})
	return ev, rej, d
}

// TestDebeziumRecentSchema: a document that carries the schema of the
// last one, in either layout, decodes as it does with a decoder that has
// seen none, valid or not; and a valid one is read without its schema
// being checked and parsed again.
func TestDebeziumRecentSchema(t *testing.T) {
	schema, payload := compactParts(t)
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	withAfter := func(v string) string { return strings.Replace(payload, `"before":null`, `"before":null,"x":`+v, 1) }
	tests := []struct {
		name    string
		payload string
		known   bool // the payload is read without its schema being parsed again
	}{
		{"a change", payload, true},
		{"spaces around the payload", " \n" + payload + " ", true},
		{"a form feed, not JSON's white space, before the payload", "\f0", false},
		{"a tombstone's null payload", "null", true},
		{"a member after the payload", payload + `,"x":1`, false},
		{"two payloads", payload + "," + payload, false},
		{"a payload cut short", payload[:len(payload)-1], false},
		{"invalid UTF-8", withAfter("\"\xff\""), false},
		{"an escaped NUL", withAfter(`"\u0000"`), false},
		{"nested as deep as a document may be", withAfter(deep(maxDepth - 2)), true},
		{"nested one level deeper", withAfter(deep(maxDepth - 1)), false},
		{"not JSON", `{"op":`, false},
	}
	for _, tt := range tests {
		for _, layout := range []string{"schema first", "payload first"} {
			t.Run(tt.name+", "+layout, func(t *testing.T) {
				value := `{"schema":` + schema + `,"payload":` + tt.payload + `}`
				if layout == "payload first" {
					value = `{"payload":` + tt.payload + `,"schema":` + schema + `}`
				}
				wantEv, wantRej := decodeCold(t, value)
				ev, rej, d := decodeWarm(t, value)
				if !reflect.DeepEqual(rej, wantRej) || !reflect.DeepEqual(ev, wantEv) {
					t.Errorf("with the schema known: %+v %v\nwith none: %+v %v", ev, rej, wantEv, wantRej)
				}
				if _, s := d.dbz.schemas.known(0, []byte(value)); (s != nil) != tt.known {
					t.Errorf("known: %v, want %v", s != nil, tt.known)
				}
			})
		}
	}
}

// FuzzDebeziumRecentSchema: whatever the payload beside a schema the
// decoder knows, the record decodes as it does with a decoder that knows
// none.
func FuzzDebeziumRecentSchema(f *testing.F) {
	_, payload := compactParts(f)
	for _, p := range []string{payload, "null", payload + `,"x":1`, `{"op":"c"}`, "[" + payload + "]"} {
		f.Add(p, false)
		f.Add(p, true)
	}
	schema, _ := compactParts(f)
	f.Fuzz(func(t *testing.T, p string, payloadFirst bool) {
		value := `{"schema":` + schema + `,"payload":` + p + `}`
		if payloadFirst {
			value = `{"payload":` + p + `,"schema":` + schema + `}`
		}
		wantEv, wantRej := decodeCold(t, value)
		ev, rej, _ := decodeWarm(t, value)
		if !reflect.DeepEqual(rej, wantRej) || !reflect.DeepEqual(ev, wantEv) {
			t.Errorf("with the schema known: %+v %v\nwith none: %+v %v", ev, rej, wantEv, wantRej)
		}
	})
}
