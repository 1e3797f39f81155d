package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// everyKind is a valid configuration with a source of every kind, an
// aggregate and OAUTHBEARER, so that every key of the table applies
// somewhere. TOKEN is replaced by a token file.
const everyKind = `warehouse: {dsn: postgres://h/db}
kafka:
  brokers: [localhost:9092]
  tls: {server_name: kafka}
  sasl: {mechanism: OAUTHBEARER, token_file: TOKEN, allow_plaintext: true, extensions: {logicalCluster: lkc}}
schema_registry:
  url: https://registry:8081
  basic: {username: u, password: p}
  tls: {server_name: registry}
sources:
  events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
    dedupe: {by: event_id, window: 7d}
  partner:
    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
  customers:
    poll: {dsn: postgres://src/db, table: customers, key: [id], updated_at: updated_at}
    mirror: {table: dw_customers}
  shop:
    cdc: {dsn: postgres://shop/db, tables: [orders]}
    mirror: {schema: shop}
aggregates:
  daily:
    source: events
    table: daily
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`

// sourceOf names the source of everyKind that a key under sources.<name>
// applies to.
func sourceOf(path string) string {
	rest, ok := strings.CutPrefix(path, "sources.<name>.")
	if !ok {
		return "daily" // aggregates.<name>
	}
	switch block, _, _ := strings.Cut(rest, "."); block {
	case "table":
		return "partner"
	case "poll", "mirror":
		return "customers"
	case "cdc":
		return "shop"
	}
	return "events"
}

// concrete fills the <name> of path as everyKind has it.
func concrete(path string) string {
	if !strings.Contains(path, "<name>") {
		return path
	}
	if strings.HasPrefix(path, "kafka.sasl.extensions.") {
		return strings.Replace(path, "<name>", "logicalCluster", 1)
	}
	return strings.Replace(path, "<name>", sourceOf(path), 1)
}

// everyKindWith returns everyKind with the key at path (names filled in)
// set to the value text; "" leaves the document as it is.
func everyKindWith(t *testing.T, path, text string) []byte {
	t.Helper()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(everyKind, "TOKEN", token, 1)
	if path == "" {
		return []byte(doc)
	}
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	n := root.Content[0]
	segs := strings.Split(path, ".")
	for i, seg := range segs {
		var next *yaml.Node
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == seg {
				next = n.Content[j+1]
			}
		}
		if next == nil {
			next = &yaml.Node{Kind: yaml.MappingNode}
			if i == len(segs)-1 {
				next = &yaml.Node{Kind: yaml.ScalarNode}
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: seg}, next)
		}
		n = next
	}
	n.Kind, n.Style, n.Tag, n.Value, n.Content = yaml.ScalarNode, 0, resolveTag(text), text, nil
	if text == "" {
		n.Style, n.Tag = yaml.DoubleQuotedStyle, "!!str"
	}
	out, err := yaml.Marshal(&root)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKeysAreTheStructs checks that the table has every key of the
// configuration structs once, and no other.
func TestKeysAreTheStructs(t *testing.T) {
	var leaves []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
			leaves = append(leaves, path)
			return
		}
		switch t.Kind() {
		case reflect.Struct:
			for i := range t.NumField() {
				f := t.Field(i)
				tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				switch {
				case !f.IsExported() || tag == "-":
				case opts == "inline":
					walk(f.Type, path)
				default:
					walk(f.Type, strings.TrimPrefix(path+"."+tag, "."))
				}
			}
		case reflect.Map:
			walk(t.Elem(), path+".<name>")
		default:
			leaves = append(leaves, path)
		}
	}
	walk(reflect.TypeFor[Config](), "")
	var paths []string
	for _, k := range Keys() {
		paths = append(paths, k.Path)
	}
	slices.Sort(leaves)
	slices.Sort(paths)
	if !slices.Equal(leaves, paths) {
		t.Errorf("the table of keys is not the keys of the structs:\nstructs %q\ntable   %q", leaves, paths)
	}
}

// TestKeysAreConsistent checks each entry of the table against itself:
// its default is a value of its type within its bounds, its bounds are
// values of its type, and what is set is used.
func TestKeysAreConsistent(t *testing.T) {
	cfg, err := Parse(file, everyKindWith(t, "", ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		s := cfg.settings(k.Path, "")
		if len(s) == 0 {
			t.Errorf("%s: everyKind does not have the key", k.Path)
			continue
		}
		typ := s[0].v.Type()
		if typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		parse := func(what, text string) int64 {
			v := reflect.New(typ).Elem()
			if err := decodeText(v, text); err != nil {
				t.Errorf("%s: %s %v", k.Path, what, err)
				return 0
			}
			if v.CanInt() {
				return v.Int()
			}
			return 0
		}
		if k.Default != "" && !strings.Contains(k.Default, "<name>") {
			d := parse("default", k.Default)
			if k.Min != "" && d < parse("min", k.Min) && !(d == 0 && k.Zero != "") {
				t.Errorf("%s: the default %s is below %s", k.Path, k.Default, k.Min)
			}
			if k.Max != "" && !strings.Contains(k.Max, ".") && d > parse("max", k.Max) {
				t.Errorf("%s: the default %s is above %s", k.Path, k.Default, k.Max)
			}
			if len(k.OneOf) > 0 && !slices.Contains(k.OneOf, k.Default) {
				t.Errorf("%s: the default %s is not one of %q", k.Path, k.Default, k.OneOf)
			}
		}
		if k.Max != "" && k.Min == "" {
			t.Errorf("%s: a Max needs a Min", k.Path)
		}
		if k.Zero != "" && (k.Min == "" || parse("min", k.Min) <= 0) {
			t.Errorf("%s: Zero says what 0 means where Min excludes it", k.Path)
		}
		if k.KeepZero && (k.Default == "" || k.Default == "0") {
			t.Errorf("%s: KeepZero only matters for a default other than 0", k.Path)
		}
		if k.Type != typeName(typ) && !(k.Type == "JSON pointer" && typ.Kind() == reflect.String) {
			t.Errorf("%s: type %s, but the field is %s", k.Path, k.Type, typ)
		}
	}
}

// TestKeysDefaults checks that a key left out takes its default, and that
// 0 written takes it too unless the key keeps 0.
func TestKeysDefaults(t *testing.T) {
	cfg, err := Parse(file, everyKindWith(t, "", ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	written := writtenIn(func() *yaml.Node {
		var root yaml.Node
		if err := yaml.Unmarshal(everyKindWith(t, "", ""), &root); err != nil {
			t.Fatal(err)
		}
		return &root
	}())
	for _, k := range Keys() {
		if k.Default == "" || k.defaultIn != nil {
			continue
		}
		for _, s := range cfg.settings(k.Path, "") {
			if written(s.segs) {
				continue
			}
			want := reflect.New(s.v.Type()).Elem()
			if err := decodeText(want, strings.ReplaceAll(k.Default, "<name>", s.name)); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.v.Interface(), want.Interface()) {
				t.Errorf("%s left out is %v, want %s", s.path(), s.v.Interface(), k.Default)
			}
		}
		if k.Default == "0" || k.Default == "false" || strings.Contains(k.Default, "<name>") {
			continue
		}
		zero := "0"
		if len(k.OneOf) > 0 || k.Type == "string" {
			zero = ""
		}
		if k.Type == "boolean" {
			zero = "false"
		}
		path := concrete(k.Path)
		c, err := Parse(file, everyKindWith(t, path, zero), noEnv)
		if err != nil {
			t.Errorf("%s: %s: %v", path, zero, err)
			continue
		}
		s := c.settings(k.Path, sourceOf(k.Path))
		if len(s) != 1 {
			t.Fatalf("%s: %d settings", path, len(s))
		}
		keeps := k.KeepZero || k.Type == "boolean"
		if got := s[0].v.IsZero(); got != keeps {
			t.Errorf("%s written as %s is %v; KeepZero is %v", path, zero, s[0].v.Interface(), k.KeepZero)
		}
	}
}

// TestKeysBoundsChecked checks that the bounds and values of every key
// in the table are enforced, with an error that names the key, the
// bound and the value.
func TestKeysBoundsChecked(t *testing.T) {
	cfg, err := Parse(file, everyKindWith(t, "", ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		if len(k.OneOf) == 0 && k.Min == "" {
			continue
		}
		path := concrete(k.Path)
		bad := "bogus"
		if len(k.OneOf) == 0 {
			s := cfg.settings(k.Path, sourceOf(k.Path))[0]
			bad = badValue(t, cfg, k, s.v.Type())
		}
		_, err := Parse(file, everyKindWith(t, path, bad), noEnv)
		errs, _ := err.(Errors)
		found := false
		for _, e := range errs {
			bound, got := k.Min, "got "+bad
			if k.Min == "0" && k.Max == "" {
				bound = "must not be negative"
			}
			if len(k.OneOf) > 0 {
				bound, got = k.OneOf[len(k.OneOf)-1], fmt.Sprintf("got %q", bad)
			}
			found = found || e.Key == path && e.Line > 0 && strings.Contains(e.Msg, "must ") &&
				strings.Contains(e.Msg, bound) && strings.HasSuffix(e.Msg, got)
		}
		if !found {
			t.Errorf("%s: %s: want an error naming the key and the value, got %v", path, bad, err)
		}
	}
}

// badValue is a value of key k just outside its bounds, written as in the
// file.
func badValue(t *testing.T, cfg *Config, k Key, typ reflect.Type) string {
	t.Helper()
	elem := typ
	if elem.Kind() == reflect.Pointer {
		elem = elem.Elem()
	}
	var v int64
	if k.Max != "" && !strings.Contains(k.Max, ".") {
		v, _ = cfg.bound(typ, k.Max)
		v++
	} else {
		v, _ = cfg.bound(typ, k.Min)
		if v--; v == 0 {
			v = -1
		}
	}
	switch elem {
	case durationType:
		return fmt.Sprintf("%dns", v)
	case percentType:
		return Percent(v).String()
	}
	return fmt.Sprint(v)
}
