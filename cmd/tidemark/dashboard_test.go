package main

// The test in this file keeps the Grafana dashboard and the alerting
// rules in step with the metrics the binary exports: every query names
// metrics, and labels of them (in matchers and in by, without, on and
// ignoring clauses), that exist. The metrics are those that
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

	"github.com/tidemark-dev/tidemark/internal/testkit/testenv"
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
	// clauseRe matches a clause that names labels of the expression it
	// applies to: the grouping of an aggregation (by, without) and the
	// matching of a binary operation (on, ignoring), with its label list.
	clauseRe = regexp.MustCompile(`\b(by|without|on|ignoring)\s*\(([^()]*)\)`)
	// identRe matches a name: of a metric, a function, a keyword.
	identRe = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// producerRe matches a function that adds a label named by one of its
	// string arguments.
	producerRe = regexp.MustCompile(`\b(label_replace|label_join|count_values)\s*\(`)
)

// targetLabels are the labels Prometheus adds to every series it scrapes,
// and the name every series has.
var targetLabels = []string{"job", "instance", "__name__"}

// otherMetrics are the metrics the queries use that the binary exports
// through the Prometheus client's own collectors, or that Prometheus
// itself records, with their labels beyond targetLabels.
var otherMetrics = map[string][]string{
	"up":                                   nil,
	"go_goroutines":                        nil,
	"process_cpu_seconds_total":            nil,
	"process_open_fds":                     nil,
	"process_resident_memory_bytes":        nil,
	"promhttp_metric_handler_errors_total": {"cause"},
}

// promKeywords are the names in PromQL that are not metrics: aggregation
// operators (which may be followed by a clause before their parenthesis),
// binary operators and modifiers.
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

// metricLabels returns the labels a series of the named metric has
// beyond targetLabels: those its definition states, le for a
// histogram's _bucket and quantile for a summary. def is the definition
// (of the histogram or summary for a suffixed name), nil for another
// metric; ok is false when the labels are not known.
func metricLabels(name string, defs map[string]*metricDef) (labels []string, def *metricDef, ok bool) {
	if l, other := otherMetrics[name]; other {
		return l, nil, true
	}
	def = defs[name]
	var extra []string
	if def != nil && def.kind == "summary" {
		extra = append(extra, "quantile")
	}
	if def == nil {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(name, suffix); base != name && defs[base] != nil {
				def = defs[base]
				if suffix == "_bucket" {
					extra = append(extra, "le")
				}
			}
		}
	}
	if def == nil || !def.known {
		return nil, def, false
	}
	return append(slices.Clone(def.labels), extra...), def, true
}

// checkQueries fails the test for every problem queryProblems finds.
func checkQueries(t *testing.T, file string, queries []promQuery, defs map[string]*metricDef) {
	t.Helper()
	for _, p := range queryProblems(file, queries, defs) {
		t.Error(p)
	}
}

// queryProblems returns a problem for every metric a query names that
// the binary does not export, every label matcher on one of its metrics
// with a label the metric does not have, and every label of a by,
// without, on or ignoring clause that none of the metrics of the
// expression the clause applies to has (see clauseProblems).
func queryProblems(file string, queries []promQuery, defs map[string]*metricDef) []string {
	var out []string
	names := exported(defs)
	for _, q := range queries {
		for _, m := range metricRe.FindAllStringSubmatch(q.expr, -1) {
			if name := m[1]; !names[name] {
				out = append(out, fmt.Sprintf("%s, %s: %s is not a metric of the binary%s\n\t%s", file, q.where, name, suggestMetric(name, names), q.expr))
			}
		}
		for _, m := range selectorRe.FindAllStringSubmatch(q.expr, -1) {
			name := m[1]
			labels, def, ok := metricLabels(name, defs)
			if !ok {
				continue
			}
			allowed := append(slices.Clone(targetLabels), labels...)
			for _, l := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(allowed, l[1]) {
					out = append(out, fmt.Sprintf("%s, %s: %s has no label %s (its labels: %s; defined at %s)\n\t%s", file, q.where, name, l[1],
						strings.Join(def.labels, ", "), def.where, q.expr))
				}
			}
		}
		for _, p := range clauseProblems(q.expr, defs) {
			out = append(out, fmt.Sprintf("%s, %s: %s\n\t%s", file, q.where, p, q.expr))
		}
	}
	return out
}

// clauseProblems checks the labels of the by, without, on and ignoring
// clauses of expr against the metrics of the expression each applies
// to: the argument of the aggregation for by and without, and for on and
// ignoring the innermost parenthesis (or the whole query) around the
// binary operation, which holds both its operands. A label is fine if one
// of those metrics has it, if every series has it (targetLabels), or if
// the expression produces it: le of a histogram's buckets, the label
// label_replace, label_join or count_values adds. A clause over a metric
// whose labels are not known is not checked.
func clauseProblems(expr string, defs map[string]*metricDef) []string {
	masked := maskQuery(expr)
	var out []string
	for _, m := range clauseRe.FindAllStringSubmatchIndex(masked, -1) {
		kind := masked[m[2]:m[3]]
		var labels []string
		for l := range strings.SplitSeq(masked[m[4]:m[5]], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		if len(labels) == 0 {
			continue
		}
		lo, hi := enclosingGroup(masked, m[0])
		if kind == "by" || kind == "without" {
			if j := skipSpace(masked, m[1]); j < len(masked) && masked[j] == '(' {
				lo, hi = j, matchingParen(masked, j) // sum by (l) (expr)
			} else if k := strings.TrimRight(masked[:m[0]], " \t\n"); strings.HasSuffix(k, ")") {
				hi = len(k) - 1 // sum (expr) by (l)
				lo = openingParen(masked, hi)
			}
		}
		allowed := slices.Clone(targetLabels)
		var metrics []string
		known := true
		for _, name := range scopeMetrics(masked, lo, hi) {
			l, _, ok := metricLabels(name, defs)
			if !ok {
				known = false
				break
			}
			metrics = append(metrics, name)
			allowed = append(allowed, l...)
		}
		if !known {
			continue
		}
		allowed = append(allowed, producedLabels(expr, masked, lo, hi)...)
		for _, l := range labels {
			if !slices.Contains(allowed, l) {
				out = append(out, fmt.Sprintf("%s (%s): no metric of the expression it applies to (%s) has label %s",
					kind, masked[m[4]:m[5]], strings.Join(metrics, ", "), l))
			}
		}
	}
	return out
}

// maskQuery returns expr with the contents of its string literals, label
// matchers and range or subquery brackets, and its Grafana variables,
// replaced by spaces, so that its parentheses and names can be found by
// position.
func maskQuery(expr string) string {
	b := []byte(grafanaVarRe.ReplaceAllStringFunc(expr, func(v string) string { return strings.Repeat(" ", len(v)) }))
	var quote, closing byte
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case quote != 0:
			if c == '\\' && quote != '`' && i+1 < len(b) {
				b[i], b[i+1] = ' ', ' '
				i++
			} else if c == quote {
				quote = 0
			} else {
				b[i] = ' '
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case closing != 0:
			if c == closing {
				closing = 0
			} else {
				b[i] = ' '
			}
		case c == '{':
			closing = '}'
		case c == '[':
			closing = ']'
		}
	}
	return string(b)
}

// skipSpace returns the index of the first character at or after i that
// is not white space.
func skipSpace(s string, i int) int {
	for i < len(s) && strings.ContainsRune(" \t\n", rune(s[i])) {
		i++
	}
	return i
}

// matchingParen returns the index of the parenthesis that closes the one
// at open, or len(s) if none does.
func matchingParen(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return len(s)
}

// openingParen returns the index of the parenthesis that the one at close
// closes, or -1 if none does.
func openingParen(s string, close int) int {
	depth := 0
	for i := close; i >= 0; i-- {
		switch s[i] {
		case ')':
			depth++
		case '(':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}

// enclosingGroup returns the bounds of the innermost parenthesis around
// position i, or -1 and len(s) for the whole query.
func enclosingGroup(s string, i int) (lo, hi int) {
	depth := 0
	for j := i - 1; j >= 0; j-- {
		switch s[j] {
		case ')':
			depth++
		case '(':
			if depth == 0 {
				return j, matchingParen(s, j)
			}
			depth--
		}
	}
	return -1, len(s)
}

// scopeMetrics returns the metric names in masked[lo:hi]: the names that
// are neither a keyword, nor a function (followed by a parenthesis), nor
// the labels of a clause.
func scopeMetrics(masked string, lo, hi int) []string {
	scope := []byte(masked[lo+1 : hi])
	for _, m := range clauseRe.FindAllSubmatchIndex(scope, -1) {
		for i := m[4]; i < m[5]; i++ {
			scope[i] = ' '
		}
	}
	var out []string
	for _, m := range identRe.FindAllIndex(scope, -1) {
		name := string(scope[m[0]:m[1]])
		if promKeywords[name] || (m[0] > 0 && (isNameByte(scope[m[0]-1]) || scope[m[0]-1] == '.')) {
			continue // a keyword, or the tail of a number such as 1e3
		}
		if j := skipSpace(string(scope), m[1]); j < len(scope) && scope[j] == '(' {
			continue // a function
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// isNameByte reports whether c may be part of a name or a number.
func isNameByte(c byte) bool {
	return c == '_' || c == ':' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// producedLabels returns the labels that label_replace, label_join and
// count_values in expr[lo:hi] add: their destination label, a string
// argument (the second of label_replace and label_join, the first of
// count_values).
func producedLabels(expr, masked string, lo, hi int) []string {
	var out []string
	for _, m := range producerRe.FindAllStringSubmatchIndex(masked[lo+1:hi], -1) {
		open := lo + 1 + m[1] - 1
		arg := 1
		if masked[lo+1+m[2]:lo+1+m[3]] == "count_values" {
			arg = 0
		}
		depth, n, start := 0, 0, open+1
		for i := open + 1; i < len(masked); i++ {
			c := masked[i]
			if c == '(' {
				depth++
			} else if c == ')' && depth > 0 {
				depth--
			} else if (c == ',' || c == ')') && depth == 0 {
				if n == arg {
					if v, err := strconv.Unquote(strings.TrimSpace(expr[start:i])); err == nil {
						out = append(out, v)
					}
					break
				}
				n, start = n+1, i+1
			}
		}
	}
	return out
}

// requirePromtoolEnv names the variable that makes a missing promtool an
// error rather than a reason to skip, as for make rules; CI sets it.
const requirePromtoolEnv = "TIDEMARK_REQUIRE_PROMTOOL"

// findPromtool returns the path of promtool, "" when it is not installed,
// or an error when it is not installed but required.
func findPromtool() (string, error) {
	promtool, err := exec.LookPath("promtool")
	if err == nil {
		return promtool, nil
	}
	if os.Getenv(requirePromtoolEnv) != "" {
		return "", fmt.Errorf("promtool not found (%s is set): %w", requirePromtoolEnv, err)
	}
	return "", nil
}

// checkSyntax has promtool parse every query, with Grafana's variables
// replaced by values, as recording rules.
func checkSyntax(t *testing.T, queries []promQuery) {
	t.Helper()
	promtool, err := findPromtool()
	if err != nil {
		t.Fatal(err)
	}
	if promtool == "" {
		testenv.Missing(t, "PROMTOOL", "promtool not found: the queries' syntax is not checked (make lint and CI install it)")
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
// histograms), every label matcher on one names a label it has, and every
// label of a by, without, on or ignoring clause is one of the metrics the
// clause applies to (clauseProblems). It also checks that the dashboard
// is importable as documented (its data source and template variables)
// and, with promtool, that its queries parse; without promtool that check
// is skipped, or fails when TIDEMARK_REQUIRE_PROMTOOL is set.
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

// TestDashboardClauseLabels: the labels of by, without, on and ignoring
// clauses are checked against the metrics of the expression each applies
// to, allowing job and instance, le of histogram buckets and labels the
// query adds itself, and not checked over a metric of unknown labels.
func TestDashboardClauseLabels(t *testing.T) {
	defs := map[string]*metricDef{
		"tidemark_rows_total":      {name: "tidemark_rows_total", kind: "counter", labels: []string{"source", "op"}, known: true, where: "a.go"},
		"tidemark_up":              {name: "tidemark_up", kind: "gauge", labels: []string{"source"}, known: true, where: "b.go"},
		"tidemark_partitions":      {name: "tidemark_partitions", kind: "gauge", labels: []string{"aggregate", "state"}, known: true, where: "c.go"},
		"tidemark_run_seconds":     {name: "tidemark_run_seconds", kind: "histogram", labels: []string{"aggregate"}, known: true, where: "d.go"},
		"tidemark_collected_total": {name: "tidemark_collected_total", kind: "counter", where: "e.go"},
	}
	for _, tc := range []struct {
		expr string
		bad  []string // labels reported, in order
	}{
		{expr: `sum by (source, op) (rate(tidemark_rows_total[5m]))`},
		{expr: `sum by (nosuchlabel) (rate(tidemark_rows_total[5m]))`, bad: []string{"nosuchlabel"}},
		{expr: `sum(rate(tidemark_rows_total{source="$source"}[5m])) by (job, instance, state)`, bad: []string{"state"}},
		{expr: `sum without (op) (tidemark_rows_total)`},
		{expr: `max without (aggregate) (tidemark_rows_total)`, bad: []string{"aggregate"}},
		// on over two metrics: a label of either is fine.
		{expr: `tidemark_rows_total * on (job, source) group_left tidemark_up`},
		{expr: `sum by (source) (tidemark_rows_total) * on (op) tidemark_up`},
		{expr: `tidemark_up and ignoring (state) tidemark_partitions`},
		{expr: `tidemark_up and ignoring (nosuchlabel) tidemark_partitions`, bad: []string{"nosuchlabel"}},
		// The clause applies to its own operation, not to the whole query.
		{expr: `(tidemark_up == 0) and on (state) (tidemark_partitions > 1)`},
		{expr: `sum by (state) (tidemark_up) + sum by (state) (tidemark_partitions)`, bad: []string{"state"}},
		{expr: `histogram_quantile(0.99, sum by (aggregate, le) (rate(tidemark_run_seconds_bucket[5m])))`},
		{expr: `sum by (aggregate, le) (rate(tidemark_run_seconds_count[5m]))`, bad: []string{"le"}},
		{expr: `count by (version) (label_replace(tidemark_up, "version", "$1", "source", "(.*)"))`},
		{expr: `count by (n) (count_values("n", tidemark_up))`},
		{expr: `sum by (job) (up) unless on (job, source) tidemark_up`},
		{expr: `sum by (cause) (rate(promhttp_metric_handler_errors_total[5m]))`},
		{expr: `sum by (cause) (rate(go_goroutines[5m]))`, bad: []string{"cause"}},
		{expr: `sum by (whatever) (tidemark_collected_total)`},
		{expr: `sum by (whatever) (some_recorded:metric)`},
		{expr: `sum by (source) (tidemark_rows_total{reason=~"by \\(x\\)"})`},
	} {
		problems := clauseProblems(tc.expr, defs)
		var got []string
		for _, p := range problems {
			got = append(got, p[strings.LastIndex(p, " ")+1:])
		}
		if !slices.Equal(got, tc.bad) {
			t.Errorf("%s:\n\tproblems %q\n\twant them about %q", tc.expr, problems, tc.bad)
		}
	}
}

// TestFindPromtool: without promtool on the PATH, the syntax check skips,
// unless TIDEMARK_REQUIRE_PROMTOOL is set, as in CI.
func TestFindPromtool(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(requirePromtoolEnv, "")
	if p, err := findPromtool(); p != "" || err != nil {
		t.Errorf("not installed, not required: findPromtool() = %q, %v; want \"\", nil (skip)", p, err)
	}
	t.Setenv(requirePromtoolEnv, "1")
	if _, err := findPromtool(); err == nil || !strings.Contains(err.Error(), requirePromtoolEnv) {
		t.Errorf("not installed, required: findPromtool() error %v; want one naming %s", err, requirePromtoolEnv)
	}
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
