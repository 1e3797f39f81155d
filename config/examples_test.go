package config

import (
	"os"
	"strings"
	"testing"
)

// TestDocumentedExamplesParse keeps the complete example of
// docs/configuration.md and the deploy example valid.
func TestDocumentedExamplesParse(t *testing.T) {
	env := func(name string) (string, bool) {
		if strings.HasSuffix(name, "DATABASE_URL") {
			return "postgres://tidemark@db.example.com/warehouse", true
		}
		return "secret", true
	}
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## Complete example")
	if !ok {
		t.Fatal("docs/configuration.md has no Complete example section")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the Complete example has no yaml block")
	}
	examples := map[string]string{"docs/configuration.md": block}
	deploy, err := os.ReadFile("../deploy/tidemark.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	examples["deploy/tidemark.example.yaml"] = string(deploy)
	for name, text := range examples {
		cfg, err := Parse(name, []byte(text), env)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(cfg.Sources) == 0 {
			t.Errorf("%s: no sources", name)
		}
	}
}
