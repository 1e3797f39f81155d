package decode

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// referenceFields splits an object with encoding/json, as objectFields
// did before it had a scanner of its own.
func referenceFields(raw []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errJSONEnd
	}
	out := []field{}
	at := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if i, ok := at[name]; ok {
			out[i].value = v
			continue
		}
		at[name] = len(out)
		out = append(out, field{name, v})
	}
	return out, nil
}

// FuzzJSONSplit: of a document that jsonb takes, objectFields gives the
// members encoding/json gives, arrayItems the items, and textOf the text
// of a string; of any other input, they return without a panic.
func FuzzJSONSplit(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,{"c":"d"}],"a":"x"}`, `[1, "2", {"3": null}, [true]]`, `"a\"b\\c\u00e9\ud83d\ude00"`,
		`{"\u0061":1, "a" : 2 }`, `{}`, `[]`, `"\n\t"`, pgCreateWithSchema} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		fields, ferr := objectFields(doc)
		items, aerr := arrayItems(doc)
		text, ok := textOf(doc)
		if pgjson.Scan(doc, nil, nil) != nil {
			return
		}
		doc = bytes.TrimSpace(doc)
		switch doc[0] {
		case '{':
			want, err := referenceFields(doc)
			if err != nil || ferr != nil || len(fields) != len(want) {
				t.Fatalf("objectFields: %q %v, encoding/json: %q %v", fields, ferr, want, err)
			}
			for i := range want {
				if fields[i].name != want[i].name || !bytes.Equal(fields[i].value, want[i].value) {
					t.Fatalf("member %d: %q, encoding/json: %q", i, fields[i], want[i])
				}
			}
		case '[':
			var want []json.RawMessage
			if err := json.Unmarshal(doc, &want); err != nil || aerr != nil || len(items) != len(want) {
				t.Fatalf("arrayItems: %q %v, encoding/json: %q %v", items, aerr, want, err)
			}
			for i := range want {
				if !bytes.Equal(items[i], want[i]) {
					t.Fatalf("item %d: %q, encoding/json: %q", i, items[i], want[i])
				}
			}
		case '"':
			var want string
			if err := json.Unmarshal(doc, &want); err != nil || !ok || text != want {
				t.Fatalf("textOf: %q %v, encoding/json: %q %v", text, ok, want, err)
			}
		default:
			if s, err := stringValue(doc); (string(doc) == "null") != (err == nil) || s != "" {
				t.Fatalf("stringValue(%s) = %q, %v", doc, s, err)
			}
		}
		if !reflect.DeepEqual(jsonString(text), mustMarshal(t, text)) {
			t.Fatalf("jsonString(%q) = %s, json.Marshal: %s", text, jsonString(text), mustMarshal(t, text))
		}
	})
}

func mustMarshal(t *testing.T, s string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
