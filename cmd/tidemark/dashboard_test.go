package main

// The test in this file keeps the Grafana dashboard and the alerting
// rules in step with the metrics the binary exports: every query names
// metrics, and labels of them, that exist. The metrics are those that
// TestDocsMetrics finds in the binary's packages (binaryMetrics).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// promQuery is a PromQL query of the dashboard or the rules, and where it
// is.
type promQuery struct {
	where, expr string
}

// dashboardQueries returns the PromQL queries of a Grafana dashboard: the
// expr of every panel target, in rows too, and the queries of its
// template variables.
func dashboardQueries(t *testing.T, data []byte) []promQuery {
	t.Helper()
	var d struct {
		Panels     []any `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
				Query      any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var out []promQuery
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = "panel " + strconv.Quote(title)
			}
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					out = append(out, promQuery{where, s})
					continue
				}
				walk(where, x)
			}
		case []any:
			for _, x := range v {
				walk(where, x)
			}
		}
	}
	walk("panels", d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := "variable " + v.Name
		if v.Definition != "" {
			out = append(out, promQuery{where + " (definition)", v.Definition})
		}
		switch q := v.Query.(type) {
		case string:
			out = append(out, promQuery{where, q})
		case map[string]any:
			if s, ok := q["query"].(string); ok {
				out = append(out, promQuery{where, s})
			}
		}
	}
	return out
}

// ruleQueries returns the expr of every rule of a Prometheus rule file.
func ruleQueries(t *testing.T, data []byte) []promQuery {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("the rule file is not YAML: %v", err)
	}
	var out []promQuery
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, promQuery{fmt.Sprintf("group %s, rule %s%s", g.Name, r.Alert, r.Record), r.Expr})
		}
	}
	return out
}

var (
	// selectorRe matches a metric name with its label matchers.
	selectorRe = regexp.MustCompile(`\b(tidemark_[a-z0-9_]+)\s*\{([^}]*)\}`)
	// matcherRe matches the label name of a label matcher.
	matcherRe = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	// grafanaVarRe matches the Grafana variables of a query.
	grafanaVarRe = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"job", "instance"}

// checkQueries fails the test for every metric a query names that the
// binary does not export, and every label matcher on one of its metrics
// with a label the metric does not have.
func checkQueries(t *testing.T, file string, queries []promQuery, defs map[string]*metricDef) {
	t.Helper()
	names := exported(defs)
	for _, q := range queries {
		for _, m := range metricRe.FindAllStringSubmatch(q.expr, -1) {
			if name := m[1]; !names[name] {
				t.Errorf("%s, %s: %s is not a metric of the binary%s\n\t%s", file, q.where, name, suggestMetric(name, names), q.expr)
			}
		}
		for _, m := range selectorRe.FindAllStringSubmatch(q.expr, -1) {
			name := m[1]
			def := defs[name]
			allowed := slices.Clone(targetLabels)
			if def == nil {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base := strings.TrimSuffix(name, suffix); base != name && defs[base] != nil {
						def = defs[base]
						if suffix == "_bucket" {
							allowed = append(allowed, "le")
						}
					}
				}
			}
			if def == nil || !def.known {
				continue
			}
			allowed = append(allowed, def.labels...)
			for _, l := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(allowed, l[1]) {
					t.Errorf("%s, %s: %s has no label %s (its labels: %s; defined at %s)\n\t%s", file, q.where, name, l[1],
						strings.Join(def.labels, ", "), def.where, q.expr)
				}
			}
		}
	}
}

// checkSyntax has promtool parse every query, with Grafana's variables
// replaced by values, as recording rules.
func checkSyntax(t *testing.T, queries []promQuery) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: the queries' syntax is not checked (make lint and CI install it)")
	}
	values := map[string]string{"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, q := range queries {
		if strings.HasPrefix(q.expr, "label_values(") {
			continue // Grafana's function, not PromQL
		}
		expr := q.expr
		if inner, ok := strings.CutPrefix(expr, "query_result("); ok {
			expr = strings.TrimSuffix(inner, ")") // Grafana's function around a PromQL query
		}
		expr = grafanaVarRe.ReplaceAllStringFunc(expr, func(v string) string {
			if s, ok := values[strings.NewReplacer("{", "", "}", "").Replace(v)]; ok {
				return s
			}
			return "x"
		})
		quoted, _ := json.Marshal(expr)
		fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", n, quoted)
		n++
	}
	file := filepath.Join(t.TempDir(), "queries.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s\nqueries:\n%s", err, out, b.String())
	}
}

// TestDashboardMetrics checks deploy/grafana/tidemark.json and
// deploy/prometheus/alerts.yaml against the metrics the binary exports:
// every tidemark_ metric a panel, a template variable or a rule queries
// is one the binary defines (with _bucket, _sum and _count only for
// histograms), and every label matcher on one names a label it has. It
// also checks that the dashboard is importable as documented (its data
// source and template variables) and, with promtool, that its queries
// parse.
func TestDashboardMetrics(t *testing.T) {
	root := repoRoot(t)
	defs := binaryMetrics(t, root)
	if len(defs) < 10 {
		t.Fatalf("found only %d metric definitions in the binary's packages", len(defs))
	}

	const dashFile = "deploy/grafana/tidemark.json"
	dashboard := readFile(t, root, dashFile)
	queries := dashboardQueries(t, dashboard)
	if len(queries) < 40 {
		t.Fatalf("%s: found only %d queries", dashFile, len(queries))
	}
	checkQueries(t, dashFile, queries, defs)

	const rulesFile = "deploy/prometheus/alerts.yaml"
	rules := ruleQueries(t, readFile(t, root, rulesFile))
	if len(rules) < 10 {
		t.Fatalf("%s: found only %d rules", rulesFile, len(rules))
	}
	checkQueries(t, rulesFile, rules, defs)

	t.Run("importable", func(t *testing.T) {
		var d struct {
			SchemaVersion int    `json:"schemaVersion"`
			UID           string `json:"uid"`
			Panels        []struct {
				ID         int             `json:"id"`
				Type       string          `json:"type"`
				Title      string          `json:"title"`
				Datasource json.RawMessage `json:"datasource"`
				Panels     []any           `json:"panels"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Name, Type string
					Query      any
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(dashboard, &d); err != nil {
			t.Fatal(err)
		}
		if d.SchemaVersion < 36 || d.UID == "" {
			t.Errorf("schemaVersion %d, uid %q: want a schema of Grafana 10 or newer and a fixed uid", d.SchemaVersion, d.UID)
		}
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
		}
		for name, typ := range map[string]string{"DS_PROMETHEUS": "datasource", "job": "query", "instance": "query", "source": "query", "aggregate": "query"} {
			if vars[name] != typ {
				t.Errorf("template variable %s: type %q, want %q", name, vars[name], typ)
			}
		}
		ids := map[int]string{}
		for _, p := range d.Panels {
			if prev, ok := ids[p.ID]; ok {
				t.Errorf("panels %q and %q have the same id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				if len(p.Panels) > 0 {
					t.Errorf("row %q holds panels: keep rows open (collapsed: false) with their panels after them", p.Title)
				}
				continue
			}
			if !strings.Contains(string(p.Datasource), `"${DS_PROMETHEUS}"`) {
				t.Errorf("panel %q: data source %s, want the variable ${DS_PROMETHEUS}", p.Title, p.Datasource)
			}
		}
	})
	t.Run("syntax", func(t *testing.T) { checkSyntax(t, queries) })
}

// readFile reads a file of the repository.
func readFile(t *testing.T, root, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
