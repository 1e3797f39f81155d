package config

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// fuzzSecret is what fuzzLookup gives variables whose name mentions a
// password, so that a DSN can hold a password the file does not show.
const fuzzSecret = "Zq7-fuzz-secret"

// fuzzLookup is the environment of FuzzParse: *PASS* variables hold
// fuzzSecret, TIDEMARK_DATABASE_URL a DSN with it, UNSET is unset and the
// rest hold their own name in lower case.
func fuzzLookup(name string) (string, bool) {
	switch {
	case name == "UNSET":
		return "", false
	case name == EnvDatabaseURL:
		return "postgres://tidemark:" + fuzzSecret + "@db.example.com/warehouse", true
	case strings.Contains(name, "PASS"):
		return fuzzSecret, true
	}
	return strings.ToLower(name), true
}

// FuzzParse checks config.Parse on arbitrary bytes. Property: it never
// panics; it returns either a configuration or a non-empty config.Errors,
// never both and never neither; every Error names the file, and every
// Error after the YAML parses names a key or a line; no Error about
// warehouse.dsn shows the password the DSN holds; and parsing the same
// bytes again gives an equal result.
func FuzzParse(f *testing.F) {
	// The committed corpus holds documents from the docs and the tests;
	// the deploy example is added as it is today.
	if b, err := os.ReadFile("../deploy/tidemark.example.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(base()))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(file, data, fuzzLookup)
		checkParseResult(t, data, cfg, err)
		cfg2, err2 := Parse(file, data, fuzzLookup)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("Parse is not deterministic: %v, then %v", err, err2)
		}
		if err != nil && err.Error() != err2.Error() {
			t.Fatalf("Parse is not deterministic:\n%v\nthen\n%v", err, err2)
		}
		if !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("Parse is not deterministic:\n%#v\nthen\n%#v", cfg, cfg2)
		}
	})
}

// checkParseResult checks one result of Parse against FuzzParse's property.
func checkParseResult(t *testing.T, data []byte, cfg *Config, err error) {
	t.Helper()
	if err == nil {
		if cfg == nil {
			t.Fatal("Parse returned neither a configuration nor an error")
		}
		return
	}
	if cfg != nil {
		t.Fatalf("Parse returned a configuration and an error: %v", err)
	}
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error is %T, want config.Errors: %v", err, err)
	}
	if len(errs) == 0 {
		t.Fatal("Parse returned empty Errors")
	}
	var root yaml.Node
	// A file that is not YAML, or holds no document, is one problem of
	// the whole file.
	parsed := yaml.Unmarshal(data, &root) == nil && len(root.Content) > 0
	password := dsnPassword(&root)
	for _, e := range errs {
		if e.File != file {
			t.Errorf("error names file %q, want %q: %v", e.File, file, e)
		}
		if parsed && e.Key == "" && e.Line == 0 {
			t.Errorf("error names neither key nor line: %v", e)
		}
		if e.Key == "warehouse.dsn" && len(password) >= 4 && strings.Contains(e.Msg, password) {
			t.Errorf("error shows the DSN's password %q: %v", password, e)
		}
		if e.Key == "warehouse.dsn" && strings.Contains(e.Msg, fuzzSecret) {
			t.Errorf("error shows the DSN's password from the environment: %v", e)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// dsnPatterns find a password in a DSN: URL user info and keyword/value
// settings, quoted or not.
var dsnPatterns = []*regexp.Regexp{
	regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://[^:@/]*:(.*)@`),
	regexp.MustCompile(`password\s*=\s*'((?:[^'\\]|\\.)*)'`),
	regexp.MustCompile(`password\s*=\s*([^\s']\S*)`),
}

// dsnPassword returns the password written in the document's
// warehouse.dsn (after expansion), or "".
func dsnPassword(root *yaml.Node) string {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return ""
	}
	ix := newIndex(file, root)
	expandNode(ix, "", root.Content[0], fuzzLookup)
	dsn := ""
	for _, e := range ix.entries {
		if e.path == "warehouse.dsn" && e.value.Kind == yaml.ScalarNode {
			dsn = e.value.Value
		}
	}
	for _, re := range dsnPatterns {
		if m := re.FindStringSubmatch(dsn); m != nil && m[1] != "" {
			return m[1]
		}
	}
	return ""
}
