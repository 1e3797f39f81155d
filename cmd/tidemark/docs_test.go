package main

// The tests in this file keep the documentation in step with the binary:
// the commands and flags that README.md, docs/*.md, deploy/ and the usage
// text mention against the commands of this package (docs/commands.md
// has a section per command), with the flag defaults the docs state and
// each command's exit statuses, the configuration keys of
// docs/configuration.md, with their types, defaults and allowed values,
// against package config's table of keys (config.Keys), the
// metric names of the docs and the alerting rules against the metrics the
// binary's packages define (docs/metrics.md lists them all), the alerting
// rules against the sections of docs/runbook.md, the fuzz targets and
// benchmarks the docs name against those that exist, and the links
// between the documents against their files and headings. User docs name
// no Go tests: those belong in code comments. They read files only: no
// database, no broker.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"html"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tidemark-dev/tidemark/config"
)

// Allowlists. Every entry says why the name is not checked.
var (
	// notMetrics are words of the form tidemark_xxx in the docs that are
	// not Prometheus metrics.
	notMetrics = map[string]string{
		"tidemark_shop":    "the example replication slot and publication name tidemark_<source> of the CDC source shop",
		"tidemark_src":     "a column name reserved by poll sources (docs/configuration.md, Poll sources)",
		"tidemark_key":     "a column name reserved by poll sources",
		"tidemark_time":    "a column name reserved by poll sources",
		"tidemark_deleted": "a column name reserved by poll sources",
		"tidemark_payload": "a column name reserved by poll sources",
		"tidemark_rows":    "a column of the benchmark output (tidemark_rows/s) in docs/benchmarks.md",
		"tidemark_query":   "the alias of an aggregate's query in the SQL of a rebuild (docs/configuration.md, The query)",
		"tidemark_owner":   "the default migration role of tidemark grants (docs/security.md, Database roles)",
		"tidemark_run":     "the default runtime role of tidemark grants",
		"tidemark_poll":    "the default poll source role of tidemark grants",
		"tidemark_cdc":     "the default CDC source role of tidemark grants",
	}
	// notOurFlags are words in code spans that look like flags but are
	// another program's, or no flag at all.
	notOurFlags = map[string]string{
		"--tmpfs":   "docker run, in deploy/README.md",
		"-n":        "kubectl's namespace flag, in deploy/README.md",
		"-H":        "kcat's header flag, in the dead-letter replay of docs/runbook.md",
		"-infinity": "PostgreSQL's timestamp -infinity, a value",
	}
	// noSection are commands that need no section of their own in
	// docs/commands.md.
	noSection = map[string]string{
		"help": "prints the usage text; its synopsis line is all there is to say",
	}
)

// commandsFile documents every command: a synopsis before its first
// section, then a section ("## name") per command.
const commandsFile = "docs/commands.md"

// metricsFile lists every metric in a table under "## Metrics".
const metricsFile = "docs/metrics.md"

// runbookFile has a section per alert under "## Alerts".
const runbookFile = "docs/runbook.md"

// docFiles are the documents whose command lines, flags and metric names
// are checked, relative to the repository root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "deploy/README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	sort.Strings(files)
	return files
}

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func readLines(t *testing.T, root, rel string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// ---------------------------------------------------------------------
// Markdown, as far as these checks need it.

// snippet is an inline code span, a line of a fenced code block, or a
// paragraph of prose, with where it is.
type snippet struct {
	line    int    // 1-based line of its start
	text    string // the code (newlines of a span become spaces), or the prose
	lang    string // a block's info string
	block   int    // 1-based number of the fenced block; 0 outside blocks
	heading string // the nearest heading above
	h2, h3  string // the nearest headings of levels 2 and 3 (h3 reset by a new h2)
	para    string // a span's paragraph
}

type mdTable struct {
	line       int // line of the header
	header     []string
	rows       []mdRow
	heading    string
	h2         string
	sectionEnd int // last line before the next heading
}

type mdRow struct {
	line  int
	cells []string
}

type mdDoc struct {
	file     string
	lines    []string
	spans    []snippet
	code     []snippet // lines of fenced code blocks
	prose    []snippet // paragraphs outside code blocks, newlines kept
	headings []mdHeading
	tables   []mdTable
}

type mdHeading struct {
	line, level int
	text, h2    string // h2: the heading of level 2 it is under, or itself
}

var (
	fenceRe    = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^`\\s]*)")
	headingRe  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	listItemRe = regexp.MustCompile(`^\s*(?:[-*+]|\d+\.)\s`)
)

func parseMarkdown(t *testing.T, root, file string) *mdDoc {
	t.Helper()
	d := &mdDoc{file: file, lines: readLines(t, root, file)}
	var h2, h3, heading string
	var para []int
	flush := func() {
		if len(para) == 0 {
			return
		}
		var text strings.Builder
		for i, n := range para {
			if i > 0 {
				text.WriteByte('\n')
			}
			text.WriteString(d.lines[n-1])
		}
		s := snippet{line: para[0], text: text.String(), heading: heading, h2: h2, h3: h3}
		d.prose = append(d.prose, s)
		table := strings.HasPrefix(strings.TrimSpace(s.text), "|")
		for _, sp := range codeSpans(s.text) {
			c := s
			c.line = s.line + strings.Count(s.text[:sp.off], "\n")
			c.text = sp.text
			c.para = s.text
			if table {
				c.text = strings.ReplaceAll(c.text, `\|`, "|")
			}
			d.spans = append(d.spans, c)
		}
		para = nil
	}
	var fence, lang string
	blocks := 0
	var table *mdTable
	endTable := func() {
		if table != nil {
			d.tables = append(d.tables, *table)
			table = nil
		}
	}
	for i, l := range d.lines {
		n := i + 1
		if fence != "" {
			trimmed := strings.TrimSpace(l)
			if strings.HasPrefix(trimmed, fence[:1]) && strings.Trim(trimmed, fence[:1]) == "" && len(trimmed) >= len(fence) {
				fence = ""
				continue
			}
			d.code = append(d.code, snippet{line: n, text: l, lang: lang, block: blocks, heading: heading, h2: h2, h3: h3})
			continue
		}
		if m := fenceRe.FindStringSubmatch(l); m != nil {
			flush()
			endTable()
			fence, lang = m[1], m[2]
			blocks++
			continue
		}
		trimmed := strings.TrimSpace(l)
		if m := headingRe.FindStringSubmatch(l); m != nil {
			flush()
			endTable()
			level := len(m[1])
			heading = m[2]
			switch level {
			case 2:
				h2, h3 = heading, ""
			case 3:
				h3 = heading
			}
			d.headings = append(d.headings, mdHeading{line: n, level: level, text: heading, h2: h2})
			para = []int{n}
			flush()
			continue
		}
		switch {
		case trimmed == "":
			flush()
			endTable()
		case strings.HasPrefix(trimmed, "|"):
			flush()
			cells := splitRow(trimmed)
			switch {
			case table == nil:
				table = &mdTable{line: n, header: cells, heading: heading, h2: h2}
			case len(table.rows) == 0 && strings.Trim(trimmed, "|-: ") == "":
				// the delimiter row
			default:
				table.rows = append(table.rows, mdRow{line: n, cells: cells})
			}
			para = []int{n}
			flush()
		case listItemRe.MatchString(l):
			flush()
			endTable()
			para = []int{n}
		default:
			endTable()
			para = append(para, n)
		}
	}
	flush()
	endTable()
	// A table's section ends at the next heading.
	for i := range d.tables {
		d.tables[i].sectionEnd = len(d.lines)
		for _, h := range d.headings {
			if h.line > d.tables[i].line {
				d.tables[i].sectionEnd = h.line - 1
				break
			}
		}
	}
	return d
}

// splitRow splits a table row into its cells at pipes that are not
// escaped.
func splitRow(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	row = strings.TrimSuffix(row, "|")
	var cells []string
	var cell strings.Builder
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			cell.WriteString(`\|`)
			i++
		case row[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(row[i])
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

type span struct {
	off  int
	text string
}

// codeSpans finds the inline code spans of a paragraph as CommonMark
// does: a run of backticks up to the next run of the same length.
func codeSpans(text string) []span {
	var out []span
	run := func(i int) int {
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		return n
	}
	for i := 0; i < len(text); {
		switch {
		case text[i] == '\\' && i+1 < len(text):
			i += 2
			continue
		case text[i] != '`':
			i++
			continue
		}
		n := run(i)
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := run(j)
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		c := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if len(c) >= 2 && c[0] == ' ' && c[len(c)-1] == ' ' && strings.TrimSpace(c) != "" {
			c = c[1 : len(c)-1]
		}
		out = append(out, span{off: i, text: c})
		i = end + n
	}
	return out
}

// ---------------------------------------------------------------------
// Commands and flags.

// cli is what the binary defines: its commands and each one's flags.
type cli struct {
	flags    map[string][]string          // command -> flag names; nil for commands that parse no flags
	aliases  map[string][]string          // flag -> every name of that flag (the shared -c/--config)
	defaults map[string]map[string]string // command -> flag -> its default as -h prints it; absent when -h prints none
}

// binaryCLI reads each command's flags from the flag package's own
// listing, `tidemark <command> -h`, which returns before the command does
// anything. The shared flags of every command come from flags(), whose
// aliases (-c and --config) share one value.
func binaryCLI(t *testing.T) cli {
	t.Helper()
	c := cli{flags: map[string][]string{}, aliases: map[string][]string{}, defaults: map[string]map[string]string{}}
	shared, _ := flags("probe", io.Discard)
	byValue := map[flag.Value][]string{}
	shared.VisitAll(func(f *flag.Flag) { byValue[f.Value] = append(byValue[f.Value], f.Name) })
	for _, names := range byValue {
		for _, n := range names {
			c.aliases[n] = names
		}
	}
	flagLine := regexp.MustCompile(`(?m)^  -(\S+)`)
	for name, cmd := range commands {
		var stdout, stderr bytes.Buffer
		if code := cmd(context.Background(), []string{"-h"}, &stdout, &stderr); code != exitOK {
			t.Fatalf("tidemark %s -h: exit code %d\n%s%s", name, code, stdout.String(), stderr.String())
		}
		if !strings.HasPrefix(stdout.String(), "Usage of tidemark "+name+":") {
			c.flags[name] = nil // parses no flags
			continue
		}
		c.flags[name] = []string{}
		c.defaults[name] = map[string]string{}
		out := stdout.String()
		starts := flagLine.FindAllStringSubmatchIndex(out, -1)
		for i, m := range starts {
			flagName := strings.Fields(out[m[2]:m[3]])[0]
			c.flags[name] = append(c.flags[name], flagName)
			end := len(out)
			if i+1 < len(starts) {
				end = starts[i+1][0]
			}
			if d := flagDefaultRe.FindStringSubmatch(strings.TrimSpace(out[m[0]:end])); d != nil {
				if v, err := strconv.Unquote(d[1]); err == nil {
					d[1] = v
				}
				c.defaults[name][flagName] = d[1]
			}
		}
	}
	return c
}

// anyDefault reports whether the flag f of cmd (of any command, when cmd
// is not one) has a default the flag package prints.
func (c cli) anyDefault(cmd, f string) bool {
	for n, defs := range c.defaults {
		if _, ok := defs[strings.TrimLeft(f, "-")]; ok && (n == cmd || !c.isCommand(cmd)) {
			return true
		}
	}
	return false
}

func (c cli) isCommand(name string) bool {
	_, ok := c.flags[name]
	return ok
}

func (c cli) commandNames() []string { return sortedKeys(c.flags) }

// hasFlag reports whether cmd accepts the flag written as f (-x or --x);
// -h and -help are the flag package's own.
func (c cli) hasFlag(cmd, f string) bool {
	name := strings.TrimLeft(f, "-")
	fl, ok := c.flags[cmd]
	if !ok || fl == nil {
		return false
	}
	return name == "h" || name == "help" || slices.Contains(fl, name)
}

func (c cli) anyHasFlag(f string) bool {
	for cmd := range c.flags {
		if c.hasFlag(cmd, f) {
			return true
		}
	}
	return false
}

func (c cli) flagList(cmd string) string {
	var out []string
	for _, f := range c.flags[cmd] {
		out = append(out, "-"+f)
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// groups are cmd's flags with their aliases together.
func (c cli) groups(cmd string) [][]string {
	var out [][]string
	seen := map[string]bool{}
	for _, f := range c.flags[cmd] {
		if seen[f] {
			continue
		}
		g := c.aliases[f]
		if g == nil {
			g = []string{f}
		}
		for _, n := range g {
			seen[n] = true
		}
		out = append(out, g)
	}
	return out
}

// flagDefaultRe is how the flag package prints a flag's default, at the
// end of its usage: (default "1d"), (default 1), (default 10m0s).
var flagDefaultRe = regexp.MustCompile(`\(default (.*)\)$`)

var (
	// invocationRe finds "tidemark <word>", also as bin/tidemark or
	// /usr/local/bin/tidemark; a colon after the word makes it a message
	// prefix ("tidemark keys: ...").
	invocationRe = regexp.MustCompile(`(?:^|[\s/="'(\[` + "`" + `])tidemark[ \t]+([a-z][a-z0-9-]*)(:?)`)
	flagRe       = regexp.MustCompile(`(?:^|[\s\[(])(--?[a-zA-Z][a-zA-Z0-9-]*)`)
	bareCmdRe    = regexp.MustCompile(`^([a-z]+)\s+(-.*)$`)
	wordRe       = regexp.MustCompile(`[a-z]+`)
	// argsRe finds the arguments of a container: args: ["run", ...] in
	// a Kubernetes manifest, CMD ["run"] in a Dockerfile.
	argsRe = regexp.MustCompile(`^\s*(?:args:|CMD)\s*(\[.*\])\s*$`)
)

// commandLine cuts text at the end of a command line: a backtick, a
// shell separator or a comment. A pipe inside brackets separates
// alternatives of a synopsis ([--shadow | --publish]).
func commandLine(text string) string {
	depth := 0
	for i := 0; i < len(text); i++ {
		rest := text[i:]
		switch {
		case text[i] == '[':
			depth++
		case text[i] == ']':
			depth--
		case text[i] == '`' || text[i] == ';' || strings.HasPrefix(rest, "&&") || strings.HasPrefix(rest, "||"),
			(text[i] == ' ' || text[i] == '\t') && strings.HasPrefix(rest[1:], "#"),
			depth <= 0 && strings.HasPrefix(rest, " | "):
			return text[:i]
		}
	}
	return text
}

func flagsIn(text string) []string {
	var out []string
	for _, m := range flagRe.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// invocation is a command line found in a document.
type invocation struct {
	cmd   string
	flags []string
}

// invocations finds the command lines in text. A word that is not a
// command counts as one, and fails the check, when flags follow it, or
// when nothing does and tidemark starts the line or follows a directory;
// otherwise the words are prose, such as `tidemark stopped with an error`
// or "# The tidemark image: ...". "tidemark keys: ..." is a message that
// names the command keys.
func invocations(c cli, text string) []invocation {
	var out []invocation
	for _, m := range invocationRe.FindAllStringSubmatchIndex(text, -1) {
		cmd := text[m[2]:m[3]]
		if m[4] != m[5] {
			if c.isCommand(cmd) {
				out = append(out, invocation{cmd: cmd}) // a message: no flags
			}
			continue
		}
		rest := commandLine(text[m[3]:])
		trimmed := strings.TrimSpace(rest)
		flagged := strings.HasPrefix(trimmed, "-") || strings.HasPrefix(trimmed, "[")
		// What precedes tidemark: nothing, a prompt, or a directory
		// (/usr/local/bin/tidemark, also after kubectl exec ... --).
		before := strings.Fields(strings.TrimSuffix(strings.TrimSpace(text[:m[2]]), "tidemark"))
		atStart := len(before) == 0 || (len(before) == 1 && before[0] == "$") || strings.HasSuffix(before[len(before)-1], "/")
		if !c.isCommand(cmd) && !flagged && !(trimmed == "" && atStart) {
			continue
		}
		out = append(out, invocation{cmd: cmd, flags: flagsIn(rest)})
	}
	return out
}

// logicalLines joins the continuation lines of command lines in code
// blocks: a trailing backslash, or an indented line that starts with a
// flag or an optional flag, after a line naming tidemark.
func logicalLines(code []snippet) []snippet {
	var out []snippet
	for _, s := range code {
		if n := len(out); n > 0 && out[n-1].block == s.block && s.block != 0 {
			prev := &out[n-1]
			trimmed := strings.TrimSpace(s.text)
			cont := strings.HasSuffix(prev.text, "\\") ||
				(invocationRe.MatchString(prev.text) && s.text != trimmed && (strings.HasPrefix(trimmed, "[") || strings.HasPrefix(trimmed, "-")) &&
					!slices.Contains([]string{"yaml", "yml", "sql", "json", "promql"}, s.lang))
			if cont {
				prev.text = strings.TrimSuffix(prev.text, "\\") + " " + trimmed
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// synopsis is what a command synopsis (the one of docs/commands.md,
// the usage text, the package comment) says about one command.
type synopsis struct {
	line  int
	flags []string
}

// parseSynopsis reads lines of the form "tidemark cmd [flags]", with
// continuation lines that start with a flag.
func parseSynopsis(lines []snippet) map[string]synopsis {
	out := map[string]synopsis{}
	start := regexp.MustCompile(`^(?:\S*/)?tidemark\s+([a-z][a-z0-9-]*)(.*)$`)
	cur := ""
	for _, l := range lines {
		trimmed := strings.TrimSpace(l.text)
		if m := start.FindStringSubmatch(trimmed); m != nil {
			cur = m[1]
			s := out[cur]
			if s.line == 0 {
				s.line = l.line
			}
			s.flags = append(s.flags, flagsIn(m[2])...)
			out[cur] = s
			continue
		}
		if cur != "" && (strings.HasPrefix(trimmed, "[") || strings.HasPrefix(trimmed, "-")) {
			s := out[cur]
			s.flags = append(s.flags, flagsIn(trimmed)...)
			out[cur] = s
			continue
		}
		cur = ""
	}
	return out
}

// usageFile holds the synopses the usage text is made from.
const usageFile = "cmd/tidemark/synopsis.go"

// usageLines are the lines of the usage text, numbered as printed.
func usageLines() []snippet {
	var out []snippet
	for j, l := range strings.Split(strings.TrimSuffix(usage, "\n"), "\n") {
		out = append(out, snippet{line: j + 1, text: l})
	}
	return out
}

// TestDocsCommandsExist checks that every tidemark command line in the
// documentation names a real command with flags it defines, that flags
// written on their own in a command's section of docs/commands.md
// belong to that command, and that no sentence says a command is missing.
func TestDocsCommandsExist(t *testing.T) {
	root := repoRoot(t)
	c := binaryCLI(t)
	check := func(where string, inv invocation, text string) {
		t.Helper()
		if !c.isCommand(inv.cmd) {
			t.Errorf("%s: `%s`: there is no command tidemark %s (commands: %s)", where, text, inv.cmd, strings.Join(c.commandNames(), ", "))
			return
		}
		for _, f := range inv.flags {
			if !c.hasFlag(inv.cmd, f) {
				t.Errorf("%s: `%s`: tidemark %s has no flag %s (its flags: %s)", where, text, inv.cmd, f, c.flagList(inv.cmd))
			}
		}
	}
	for _, file := range docFiles(t, root) {
		d := parseMarkdown(t, root, file)
		for _, s := range logicalLines(d.code) {
			for _, inv := range invocations(c, s.text) {
				check(fmt.Sprintf("%s:%d", file, s.line), inv, strings.TrimSpace(s.text))
			}
		}
		for _, s := range d.spans {
			where := fmt.Sprintf("%s:%d", file, s.line)
			if invs := invocations(c, s.text); len(invs) > 0 {
				for _, inv := range invs {
					check(where, inv, s.text)
				}
				continue
			}
			// `refresh --full`: a command named without tidemark.
			if m := bareCmdRe.FindStringSubmatch(s.text); m != nil && c.isCommand(m[1]) {
				check(where, invocation{cmd: m[1], flags: flagsIn(commandLine(m[2]))}, s.text)
				continue
			}
			// `--reprocess completed`: flags on their own belong to the
			// command whose section they are in, or to some command.
			if !flagRe.MatchString(s.text) || !strings.HasPrefix(s.text, "-") {
				continue
			}
			for _, f := range flagsIn(s.text) {
				if _, ok := commandAliases[f]; ok && f == s.text {
					continue // `--version`, `--help`: commands
				}
				if _, ok := notOurFlags[f]; ok {
					continue
				}
				// In a command's section of docs/commands.md, a flag
				// belongs to that command or to one the paragraph names.
				var cmds []string
				if file == commandsFile && c.isCommand(s.h2) {
					cmds = append(cmds, s.h2)
					for _, w := range wordRe.FindAllString(s.para, -1) {
						if c.isCommand(w) && !slices.Contains(cmds, w) {
							cmds = append(cmds, w)
						}
					}
				}
				ok := len(cmds) == 0 && c.anyHasFlag(f)
				for _, cmd := range cmds {
					ok = ok || c.hasFlag(cmd, f)
				}
				switch {
				case ok:
				case len(cmds) > 0:
					t.Errorf("%s: `%s` in the section of tidemark %s: it has no flag %s (its flags: %s)", where, s.text, cmds[0], f, c.flagList(cmds[0]))
				default:
					t.Errorf("%s: `%s`: no command has the flag %s", where, s.text, f)
				}
			}
		}
		for _, p := range d.prose {
			for _, claim := range missingCommandClaims(p.text) {
				for _, cmd := range claim.names {
					if c.isCommand(cmd) {
						t.Errorf("%s:%d: %q says there is no %s command, but tidemark %s exists", file, p.line+claim.lineOffset, claim.text, cmd, cmd)
					}
				}
			}
		}
	}
	// The deployment files run commands too.
	for _, file := range []string{"deploy/systemd/tidemark.service", "deploy/Dockerfile", "deploy/kubernetes/deployment.yaml", "deploy/kubernetes/migrate-job.yaml"} {
		for i, l := range readLines(t, root, file) {
			where := fmt.Sprintf("%s:%d", file, i+1)
			for _, inv := range invocations(c, l) {
				check(where, inv, strings.TrimSpace(l))
			}
			// The image's entrypoint is tidemark.
			m := argsRe.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			var args []string
			if err := json.Unmarshal([]byte(m[1]), &args); err != nil || len(args) == 0 {
				t.Errorf("%s: cannot read the arguments %s: %v", where, m[1], err)
				continue
			}
			var fl []string
			for _, a := range args[1:] {
				if strings.HasPrefix(a, "-") {
					fl = append(fl, strings.SplitN(a, "=", 2)[0])
				}
			}
			check(where, invocation{cmd: args[0], flags: fl}, strings.TrimSpace(l))
		}
	}
	// The usage text.
	listed := parseSynopsis(usageLines())
	for _, cmd := range sortedKeys(listed) {
		s := listed[cmd]
		check(fmt.Sprintf("%s (usage line %d)", usageFile, s.line), invocation{cmd: cmd, flags: s.flags}, "tidemark "+cmd)
	}
}

func firstLine(s []snippet) int {
	if len(s) == 0 {
		return 1
	}
	return s[0].line
}

type claim struct {
	text       string
	lineOffset int
	names      []string
}

var (
	// noCommandRe finds sentences that say commands do not exist: "there
	// are no backfill, verify or refresh commands", "until tidemark has a
	// refresh command".
	noCommandRe = regexp.MustCompile(`(?i)\b(?:no|until\s+[a-z]+\s+has\s+an?)\s+((?:[a-z-]+(?:,\s+|\s+or\s+|\s+and\s+))*[a-z-]+)\s+commands?\b`)
	listSepRe   = regexp.MustCompile(`,\s+|\s+or\s+|\s+and\s+`)
)

func missingCommandClaims(text string) []claim {
	var out []claim
	for _, m := range noCommandRe.FindAllStringSubmatchIndex(text, -1) {
		list := text[m[2]:m[3]]
		out = append(out, claim{
			text:       strings.Join(strings.Fields(text[m[0]:m[1]]), " "),
			lineOffset: strings.Count(text[:m[0]], "\n"),
			names:      listSepRe.Split(strings.ToLower(list), -1),
		})
	}
	return out
}

// TestDocsCommandsDocumented checks the reverse: the synopsis of
// docs/commands.md is the synopses the usage text is made from, both list
// every command with every flag, and docs/commands.md has a section for
// each command.
func TestDocsCommandsDocumented(t *testing.T) {
	root := repoRoot(t)
	c := binaryCLI(t)
	const opsFile = commandsFile
	ops := parseMarkdown(t, root, opsFile)
	var synLines []snippet
	block := 0
	for _, s := range ops.code {
		if s.h2 == "" && (block == 0 || block == s.block) {
			block = s.block
			synLines = append(synLines, s)
		}
	}
	if len(synLines) == 0 {
		t.Fatalf("%s: no code block before the first section (the synopsis)", opsFile)
	}
	sections := map[string]bool{}
	for _, h := range ops.headings {
		if h.level == 2 {
			sections[h.text] = true
		}
	}
	// The synopsis of docs/commands.md is the synopses the usage text is
	// made from, line for line.
	var want, got []string
	for _, s := range synopses {
		want = append(want, s.lines...)
	}
	for _, s := range synLines {
		got = append(got, s.text)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s:%d: the synopsis is not the synopses of %s; it should read:\n%s", opsFile, firstLine(synLines), usageFile, strings.Join(want, "\n"))
	}
	usageText := usageLines()
	for _, syn := range []struct {
		what, file string
		line       int
		lines      []snippet
	}{
		{"the synopsis", opsFile, firstLine(synLines), synLines},
		{"the usage text", usageFile, firstLine(usageText), usageText},
	} {
		listed := parseSynopsis(syn.lines)
		for _, cmd := range c.commandNames() {
			s, ok := listed[cmd]
			if !ok {
				t.Errorf("%s:%d: %s does not list the command tidemark %s (flags: %s)", syn.file, syn.line, syn.what, cmd, c.flagList(cmd))
				continue
			}
			for _, g := range c.groups(cmd) {
				found := false
				for _, f := range s.flags {
					found = found || slices.Contains(g, strings.TrimLeft(f, "-"))
				}
				if !found {
					t.Errorf("%s:%d: %s of tidemark %s does not list its flag -%s", syn.file, s.line, syn.what, cmd, strings.Join(g, "/-"))
				}
			}
		}
	}
	for _, cmd := range c.commandNames() {
		if _, exempt := noSection[cmd]; !sections[cmd] && !exempt {
			t.Errorf("%s: no section \"## %s\" describes tidemark %s", opsFile, cmd, cmd)
		}
	}
}

// ---------------------------------------------------------------------
// Exit statuses and flag defaults.

// exitStatuses reads the source of package main: the exit status
// constants (exitOK, ...) with their values, and for each command of the
// commands table the statuses it can return, that is the constants its
// function, or any function of package main it calls or names, directly
// or through others, refers to.
func exitStatuses(t *testing.T, root string) (consts map[string]int, byCommand map[string][]int) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "cmd", "tidemark", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	consts = map[string]int{}
	funcs := map[string]*ast.FuncDecl{}
	var table *ast.CompositeLit
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					funcs[d.Name.Name] = d
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					vs, ok := spec.(*ast.ValueSpec)
					if !ok {
						continue
					}
					for i, n := range vs.Names {
						switch {
						case d.Tok == token.CONST && strings.HasPrefix(n.Name, "exit") && i < len(vs.Values):
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.INT {
								v, _ := strconv.Atoi(lit.Value)
								consts[n.Name] = v
							}
						case d.Tok == token.VAR && n.Name == "commands" && i < len(vs.Values):
							table, _ = vs.Values[i].(*ast.CompositeLit)
						}
					}
				}
			}
		}
	}
	if len(consts) == 0 || table == nil {
		t.Fatal("cmd/tidemark: no exit status constants (exit...) or no commands table")
	}
	var reach func(n ast.Node, seen map[string]bool, found map[int]bool)
	reach = func(n ast.Node, seen map[string]bool, found map[int]bool) {
		ast.Inspect(n, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			if v, ok := consts[id.Name]; ok {
				found[v] = true
			}
			if fn := funcs[id.Name]; fn != nil && !seen[id.Name] {
				seen[id.Name] = true
				reach(fn.Body, seen, found)
			}
			return true
		})
	}
	byCommand = map[string][]int{}
	for _, elt := range table.Elts {
		kv := elt.(*ast.KeyValueExpr)
		name, err := strconv.Unquote(kv.Key.(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		found := map[int]bool{}
		reach(kv.Value, map[string]bool{}, found)
		byCommand[name] = slices.Sorted(maps.Keys(found))
	}
	return consts, byCommand
}

// statusParaRe finds the paragraph of a command's section of
// docs/commands.md that lists its exit statuses: "Status 0: ...; 1: ...;
// 2: ...".
var (
	statusParaRe = regexp.MustCompile(`^Status \d+:`)
	statusItemRe = regexp.MustCompile(`(?:^Status |[;.]\s+(?:Status )?)(\d+):`)
)

// TestDocsExitStatuses checks the exit statuses of docs/commands.md
// against the code: the statuses of the "Exit codes" table are the exit
// status constants of package main, and each command's section ends with
// a paragraph "Status 0: ...; 1: ...; 2: ..." that lists exactly the
// statuses its function can return (see exitStatuses).
func TestDocsExitStatuses(t *testing.T) {
	root := repoRoot(t)
	consts, byCommand := exitStatuses(t, root)
	d := parseMarkdown(t, root, commandsFile)
	var values []int
	for _, v := range consts {
		values = append(values, v)
	}
	slices.Sort(values)
	var table []int
	tableLine := 0
	for _, tb := range d.tables {
		if tb.h2 != "Exit codes" || len(tb.header) == 0 || tb.header[0] != "Status" {
			continue
		}
		tableLine = tb.line
		for _, r := range tb.rows {
			v, err := strconv.Atoi(r.cells[0])
			if err != nil {
				t.Errorf("%s:%d: the exit code table's status %q is not a number", commandsFile, r.line, r.cells[0])
			}
			table = append(table, v)
		}
	}
	switch {
	case tableLine == 0:
		t.Errorf("%s: no table under \"## Exit codes\" whose first column is Status", commandsFile)
	case !slices.Equal(table, values):
		t.Errorf("%s:%d: the exit code table lists the statuses %v; the commands exit with %v (the exit constants of cmd/tidemark)",
			commandsFile, tableLine, table, values)
	}
	documented := map[string][]int{}
	paraLine := map[string]int{}
	for _, p := range d.prose {
		if _, isCmd := byCommand[p.h2]; !isCmd || !statusParaRe.MatchString(p.text) {
			continue
		}
		if paraLine[p.h2] != 0 {
			t.Errorf("%s:%d: the section of tidemark %s lists its exit statuses twice (also at line %d)", commandsFile, p.line, p.h2, paraLine[p.h2])
			continue
		}
		paraLine[p.h2] = p.line
		for _, m := range statusItemRe.FindAllStringSubmatch(p.text, -1) {
			v, _ := strconv.Atoi(m[1])
			documented[p.h2] = append(documented[p.h2], v)
		}
	}
	for _, cmd := range sortedKeys(byCommand) {
		if _, exempt := noSection[cmd]; exempt {
			continue
		}
		got := slices.Sorted(slices.Values(documented[cmd]))
		switch {
		case paraLine[cmd] == 0:
			t.Errorf("%s: the section of tidemark %s has no paragraph \"Status 0: ...; 1: ...\"; its statuses are %v", commandsFile, cmd, byCommand[cmd])
		case !slices.Equal(got, byCommand[cmd]):
			t.Errorf("%s:%d: tidemark %s is documented to exit with %v; its code exits with %v", commandsFile, paraLine[cmd], cmd, got, byCommand[cmd])
		}
	}
}

// flagDefaultDocRe finds a flag's default in the docs: `--chunk` (default
// `1d`), `--timeout D` (default `10m`).
var (
	flagDefaultDocRe = regexp.MustCompile("`(--?[a-z][a-z0-9-]*)(?: [^`]*)?`\\s+\\(default\\b\\s*([^)]*)\\)")
	codeValueRe      = regexp.MustCompile("^`([^`]*)`")
)

// TestDocsFlagDefaults checks the defaults of flags that the docs state,
// written "`--flag` (default `value`)", against the binary's: in a
// command's section of docs/commands.md, that command's flag; elsewhere,
// every command with that flag. A duration matches however it is written.
// A flag whose default is computed at run time, and which the flag
// package therefore does not print, may have it described in words
// ("(default: now)"). The default column of a flag table ("| Flag |
// Default | ...") is checked the same way.
func TestDocsFlagDefaults(t *testing.T) {
	root := repoRoot(t)
	c := binaryCLI(t)
	check := func(where, cmd, f, doc string) {
		t.Helper()
		name := strings.TrimLeft(f, "-")
		cmds := []string{cmd}
		if !c.isCommand(cmd) {
			cmds = nil
			for _, n := range c.commandNames() {
				if c.hasFlag(n, f) {
					cmds = append(cmds, n)
				}
			}
		}
		if len(cmds) == 0 || !c.hasFlag(cmds[0], f) {
			t.Errorf("%s: no command here has the flag %s", where, f)
			return
		}
		for _, n := range cmds {
			want, ok := c.defaults[n][name]
			if !ok {
				t.Errorf("%s: %s of tidemark %s has no default, the docs say %q", where, f, n, doc)
				continue
			}
			dw, errW := time.ParseDuration(want)
			dd, errD := time.ParseDuration(doc)
			if doc != want && !(errW == nil && errD == nil && dw == dd) {
				t.Errorf("%s: the default of %s of tidemark %s is %q, the docs say %q", where, f, n, want, doc)
			}
		}
	}
	for _, file := range docFiles(t, root) {
		d := parseMarkdown(t, root, file)
		for _, p := range d.prose {
			for _, m := range flagDefaultDocRe.FindAllStringSubmatchIndex(p.text, -1) {
				where := fmt.Sprintf("%s:%d", file, p.line+strings.Count(p.text[:m[0]], "\n"))
				f, rest := p.text[m[2]:m[3]], strings.ReplaceAll(p.text[m[4]:m[5]], "\n", " ")
				cmd := ""
				if file == commandsFile {
					cmd = p.h2
				}
				v := codeValueRe.FindStringSubmatch(rest)
				switch {
				case v != nil:
					check(where, cmd, f, v[1])
				case c.anyDefault(cmd, f):
					t.Errorf("%s: write the default of %s as (default `value`), not (default %s)", where, f, rest)
				}
			}
		}
		for _, tb := range d.tables {
			if len(tb.header) < 2 || tb.header[0] != "Flag" || tb.header[1] != "Default" {
				continue
			}
			for _, r := range tb.rows {
				f := strings.Fields(firstCode(r.cells[0]))[0]
				cmd := ""
				if file == commandsFile {
					cmd = tb.h2
				}
				if _, has := c.defaults[cmd][strings.TrimLeft(f, "-")]; !has {
					continue // a default computed at run time, described in words
				}
				v := codeValueRe.FindStringSubmatch(r.cells[1])
				if v == nil {
					t.Errorf("%s:%d: write the default of %s as `value`", file, r.line, f)
					continue
				}
				check(fmt.Sprintf("%s:%d", file, r.line), cmd, f, v[1])
			}
		}
	}
}

// ---------------------------------------------------------------------
// Configuration keys.

// keyNode is a node of the configuration's key tree, built from the yaml
// tags of package config.
type keyNode struct {
	path     string // dotted, with <name> for the keys of a map
	children map[string]*keyNode
	elem     *keyNode // the value of a map's keys
	goName   string   // Type.Field, for messages
}

func (n *keyNode) leaf() bool { return n.children == nil && n.elem == nil }

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func keyTree(t reflect.Type, path, goName string) *keyNode {
	n := &keyNode{path: path, goName: goName}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType) {
		return n
	}
	switch t.Kind() {
	case reflect.Struct:
		n.children = map[string]*keyNode{}
		for i := range t.NumField() {
			f := t.Field(i)
			tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || tag == "-" {
				continue
			}
			if slices.Contains(strings.Split(opts, ","), "inline") {
				maps.Copy(n.children, keyTree(f.Type, path, goName).children)
				continue
			}
			if tag == "" {
				tag = strings.ToLower(f.Name)
			}
			n.children[tag] = keyTree(f.Type, joinKey(path, tag), t.Name()+"."+f.Name)
		}
	case reflect.Map:
		n.elem = keyTree(t.Elem(), joinKey(path, "<name>"), goName)
	}
	return n
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// resolve finds the node of a dotted path; any segment selects a map's
// value, and "<...>" only does that.
func (n *keyNode) resolve(path string) *keyNode {
	for _, seg := range strings.Split(path, ".") {
		switch {
		case n.elem != nil:
			n = n.elem
		case strings.HasPrefix(seg, "<"):
			return nil
		default:
			n = n.children[seg]
			if n == nil {
				return nil
			}
		}
	}
	return n
}

// relative resolves a key as written in prose: absolute, or relative to
// a source or an aggregate.
func (n *keyNode) relative(path string) *keyNode {
	for _, prefix := range []string{"", "sources.<name>.", "aggregates.<name>."} {
		if k := n.resolve(prefix + path); k != nil {
			return k
		}
	}
	return nil
}

func (n *keyNode) leaves() []*keyNode {
	if n.leaf() {
		return []*keyNode{n}
	}
	var out []*keyNode
	if n.elem != nil {
		return n.elem.leaves()
	}
	for _, k := range sortedKeys(n.children) {
		out = append(out, n.children[k].leaves()...)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var (
	relativeRe    = regexp.MustCompile("(?i)all keys are relative to `([^`]+)`")
	placeholderRe = regexp.MustCompile(`<[^>.]+>`)
	keyLikeRe     = regexp.MustCompile(`^[a-z][a-z0-9_]*(?:\.(?:[a-z0-9_]+|<[a-z_]+>))+$`)
)

// documentedKey is a key of a key table of docs/configuration.md.
type documentedKey struct {
	path  string // absolute, placeholders written <name>
	line  int
	cells []string // Key, Type, Default, Allowed
}

// keyTableHeader is the header of every key table.
var keyTableHeader = []string{"Key", "Type", "Default", "Allowed"}

// keyCells are the Type, Default and Allowed cells of key k's row in a key
// table. A default is written as in the file, in backticks (`72h`,
// `400d`, `8`, `true`, `tidemark_<name>`), an environment variable as
// `$NAME`, then the key's note in parentheses; a key without either has
// an empty cell. Allowed gives the values (`day`, `month`) or the bounds
// (1s or more, 2 to 1000, positive, 0 (off), or 1m or more), then the
// key's own words, after a semicolon. 0 is shown as allowed only where
// it is kept as written; elsewhere writing it selects the default.
func keyCells(k config.Key) [3]string {
	var def []string
	switch {
	case k.Env != "":
		def = append(def, "`$"+k.Env+"`")
	case k.Default != "":
		def = append(def, "`"+k.Default+"`")
	}
	if k.Note != "" {
		def = append(def, "("+k.Note+")")
	}
	var allowed []string
	var values []string
	for _, v := range k.OneOf {
		if v != "" {
			values = append(values, "`"+v+"`")
		}
	}
	if len(values) > 0 {
		allowed = append(allowed, strings.Join(values, ", "))
	}
	if k.Min != "" {
		max := k.Max
		if strings.Contains(max, ".") {
			max = "`" + max + "`"
		}
		r := k.Min + " or more"
		switch {
		case max != "":
			r = k.Min + " to " + max
		case k.Min == "0" && !k.KeepZero && k.Default != "0":
			r = "positive" // 0 selects the default
		}
		if k.Zero != "" {
			r = "0 (" + k.Zero + "), or " + r
		}
		allowed = append(allowed, r)
	}
	if k.Allowed != "" {
		allowed = append(allowed, k.Allowed)
	}
	return [3]string{k.Type, strings.Join(def, " "), strings.Join(allowed, "; ")}
}

// keyRow is the row of key k in a key table, the key written as key.
func keyRow(key string, k config.Key) string {
	c := keyCells(k)
	return strings.TrimSpace(fmt.Sprintf("| `%s` | %s | %s | %s |", key, c[0], c[1], strings.ReplaceAll(c[2], "|", `\|`)))
}

// tableKeys reads the key tables of docs/configuration.md: tables whose
// first header is "Key". A key is relative to the path named by an "All
// keys are relative to `x`" sentence of its section; or else to the
// heading when the heading is a key (### kafka.tls: `enabled`), unless
// the key starts with the heading (## warehouse: `warehouse.dsn`) or is
// a whole path of its own (## retention: `sources.<name>.retention.raw`).
// The table whose first header is "Section" lists the top-level keys.
func tableKeys(t *testing.T, d *mdDoc, tree *keyNode) (keys []documentedKey, sections []documentedKey) {
	t.Helper()
	firstSpan := func(cell string) string {
		if sp := codeSpans(cell); len(sp) > 0 {
			return sp[0].text
		}
		return ""
	}
	for _, tb := range d.tables {
		if len(tb.header) == 0 {
			continue
		}
		switch tb.header[0] {
		case "Section":
			for _, r := range tb.rows {
				sections = append(sections, documentedKey{path: firstSpan(r.cells[0]), line: r.line})
			}
			continue
		case "Key":
			if !slices.Equal(tb.header, keyTableHeader) {
				t.Errorf("%s:%d: a key table's columns are %s, not %s", d.file, tb.line, strings.Join(keyTableHeader, ", "), strings.Join(tb.header, ", "))
			}
		default:
			continue
		}
		prefix := ""
		for _, l := range d.lines[tb.line-1 : tb.sectionEnd] {
			if m := relativeRe.FindStringSubmatch(l); m != nil {
				prefix = m[1]
			}
		}
		for _, r := range tb.rows {
			key := firstSpan(r.cells[0])
			if key == "" {
				t.Errorf("%s:%d: the row of a key table has no `key` in its first column", d.file, r.line)
				continue
			}
			path := key
			first, _, _ := strings.Cut(key, ".")
			switch under := tb.heading + "." + key; {
			case prefix != "":
				path = prefix + "." + key
			case key == tb.heading || strings.HasPrefix(key, tb.heading+"."):
			case tree.resolve(tb.heading) != nil && tree.resolve(under) != nil:
				path = under
			case tree.resolve(key) != nil || tree.children[first] != nil:
				// absolute: `sources.<name>.retention.raw` under ## retention
			case tree.resolve(tb.heading) != nil:
				path = under
			}
			keys = append(keys, documentedKey{path: placeholderRe.ReplaceAllString(path, "<name>"), line: r.line, cells: r.cells})
		}
	}
	return keys, sections
}

// TestDocsConfigKeys checks that every key in the key tables of
// docs/configuration.md exists, that every key the configuration structs
// define is in one of those tables, that key-like references in the docs
// (`mirror.key_reconcile_max_delete`) and the keys of YAML snippets are
// real keys, and that no sentence says a key is not implemented.
// deploy/tidemark.example.yaml is checked by
// TestDeployExampleNamesEveryKey.
func TestDocsConfigKeys(t *testing.T) {
	root := repoRoot(t)
	tree := keyTree(reflect.TypeFor[config.Config](), "", "Config")
	const cfgFile = "docs/configuration.md"
	d := parseMarkdown(t, root, cfgFile)
	keys, sections := tableKeys(t, d, tree)
	if len(keys) == 0 {
		t.Fatalf("%s: no key tables (tables whose first column is Key)", cfgFile)
	}
	table := map[string]config.Key{}
	for _, k := range config.Keys() {
		table[k.Path] = k
	}
	documented := map[string]int{}
	for _, k := range keys {
		if tree.resolve(k.path) == nil {
			t.Errorf("%s:%d: the key %s does not exist in package config", cfgFile, k.line, k.path)
		}
		if documented[k.path] != 0 {
			t.Errorf("%s:%d: the key %s is documented again (first at line %d)", cfgFile, k.line, k.path, documented[k.path])
			continue
		}
		documented[k.path] = k.line
		spec, ok := table[k.path]
		if !ok {
			t.Errorf("%s:%d: the key %s is not in the table of keys of package config (config.Keys)", cfgFile, k.line, k.path)
			continue
		}
		// The row must say what the table of keys says, exactly.
		want := keyCells(spec)
		for i, col := range keyTableHeader[1:] {
			if got := cellAt(k.cells, i+1); got != want[i] {
				t.Errorf("%s:%d: the %s of %s is %q; package config (keys.go) says %q. The row:\n%s",
					cfgFile, k.line, col, k.path, got, want[i], keyRow(firstCode(k.cells[0]), spec))
			}
		}
	}
	for _, leaf := range tree.leaves() {
		if documented[leaf.path] != 0 {
			continue
		}
		near, nearLine := "", 0
		for p, l := range documented {
			if common := commonPrefix(p, leaf.path); len(common) > len(near) || (len(common) == len(near) && common != "" && l < nearLine) {
				near, nearLine = common, l
			}
		}
		hint := ""
		if nearLine != 0 {
			hint = fmt.Sprintf(" (keys under %s are documented near line %d)", near, nearLine)
		}
		t.Errorf("%s: the key %s (%s) is in no key table%s; its row:\n%s", cfgFile, leaf.path, leaf.goName, hint, keyRow(leaf.path, table[leaf.path]))
	}
	listed := map[string]bool{}
	for _, s := range sections {
		listed[s.path] = true
		if tree.children[s.path] == nil {
			t.Errorf("%s:%d: the section table lists %q, which is not a top-level key", cfgFile, s.line, s.path)
		}
	}
	if len(sections) == 0 {
		t.Errorf("%s: no section table (a table whose first column is Section)", cfgFile)
	} else {
		for _, name := range sortedKeys(tree.children) {
			if !listed[name] {
				t.Errorf("%s:%d: the section table does not list the top-level key %s (%s)", cfgFile, sections[0].line-2, name, tree.children[name].goName)
			}
		}
	}
	for _, file := range docFiles(t, root) {
		doc := d
		if file != cfgFile {
			doc = parseMarkdown(t, root, file)
		}
		for _, s := range doc.spans {
			if !keyLikeRe.MatchString(s.text) {
				continue
			}
			first, _, _ := strings.Cut(s.text, ".")
			if tree.relative(first) == nil || tree.relative(first).leaf() {
				continue // not a configuration key: tidemark.partitions, raw.app_events
			}
			if tree.relative(s.text) == nil {
				t.Errorf("%s:%d: `%s` is not a configuration key", file, s.line, s.text)
			}
		}
		for _, p := range doc.prose {
			for _, sentence := range notImplementedSentences(p.text) {
				for _, sp := range codeSpans(sentence.text) {
					if k := tree.relative(sp.text); k != nil {
						t.Errorf("%s:%d: %q: %s is the configuration key %s", file, p.line+sentence.lineOffset,
							strings.Join(strings.Fields(sentence.text), " "), sp.text, k.path)
					}
				}
			}
		}
		checkYAMLSnippets(t, file, doc, tree)
	}
	checkConfigMap(t, root, "deploy/kubernetes/configmap.yaml", tree)
}

// cellAt is the i-th cell of a row, "" when the row is short.
func cellAt(cells []string, i int) string {
	if i < len(cells) {
		return strings.ReplaceAll(cells[i], `\|`, "|")
	}
	return ""
}

// firstCode is the first code span of a cell.
func firstCode(cell string) string {
	if sp := codeSpans(cell); len(sp) > 0 {
		return sp[0].text
	}
	return cell
}

func commonPrefix(a, b string) string {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	var out []string
	for i := 0; i < len(as) && i < len(bs) && as[i] == bs[i]; i++ {
		out = append(out, as[i])
	}
	return strings.Join(out, ".")
}

var (
	sentenceEndRe    = regexp.MustCompile(`[.!?](?:\s+|$)`)
	notImplementedRe = regexp.MustCompile(`(?i)\bnot (?:yet )?implement`)
)

type sentence struct {
	text       string
	lineOffset int
}

// notImplementedSentences are the sentences of a paragraph that say
// something is not implemented.
func notImplementedSentences(text string) []sentence {
	if !notImplementedRe.MatchString(text) {
		return nil
	}
	var out []sentence
	start := 0
	ends := sentenceEndRe.FindAllStringIndex(text, -1)
	ends = append(ends, []int{len(text), len(text)})
	for _, e := range ends {
		s := text[start:e[1]]
		// A period inside a code span (`sources.<name>.cdc`) does not end
		// a sentence: only cut where the backticks are balanced.
		if strings.Count(s, "`")%2 != 0 && e[1] < len(text) {
			continue
		}
		if notImplementedRe.MatchString(s) {
			out = append(out, sentence{text: s, lineOffset: strings.Count(text[:start], "\n")})
		}
		start = e[1]
	}
	return out
}

// checkYAMLSnippets checks the keys of the YAML blocks of a document
// that look like configuration: a top-level key of the configuration
// among their top-level keys.
func checkYAMLSnippets(t *testing.T, file string, d *mdDoc, tree *keyNode) {
	t.Helper()
	blocks := map[int][]snippet{}
	var order []int
	for _, s := range d.code {
		if s.lang != "yaml" && s.lang != "yml" {
			continue
		}
		if blocks[s.block] == nil {
			order = append(order, s.block)
		}
		blocks[s.block] = append(blocks[s.block], s)
	}
	for _, b := range order {
		lines := blocks[b]
		var text strings.Builder
		for _, l := range lines {
			text.WriteString(l.text + "\n")
		}
		checkConfigYAML(t, file, lines[0].line, text.String(), tree)
	}
}

func checkConfigYAML(t *testing.T, file string, firstLine int, text string, tree *keyNode) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Errorf("%s:%d: a YAML block does not parse: %v", file, firstLine, err)
		return
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return
	}
	top := doc.Content[0]
	isConfig := false
	for i := 0; i < len(top.Content); i += 2 {
		isConfig = isConfig || tree.children[top.Content[i].Value] != nil
	}
	if !isConfig {
		return // not a tidemark configuration (a Prometheus file, a manifest)
	}
	var walk func(n *yaml.Node, k *keyNode)
	walk = func(n *yaml.Node, k *keyNode) {
		if n.Kind != yaml.MappingNode || k.leaf() {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i]
			child := k.elem
			if child == nil {
				child = k.children[key.Value]
			}
			if child == nil {
				t.Errorf("%s:%d: the key %s does not exist in package config", file, firstLine+key.Line-1, joinKey(k.path, key.Value))
				continue
			}
			walk(n.Content[i+1], child)
		}
	}
	walk(top, tree)
}

// checkConfigMap checks the keys of the configuration that a Kubernetes
// ConfigMap holds as data."tidemark.yaml".
func checkConfigMap(t *testing.T, root, file string, tree *keyNode) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var find func(n *yaml.Node) *yaml.Node
	find = func(n *yaml.Node) *yaml.Node {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Kind == yaml.MappingNode && n.Content[i].Value == "tidemark.yaml" {
				return n.Content[i+1]
			}
		}
		for _, c := range n.Content {
			if f := find(c); f != nil {
				return f
			}
		}
		return nil
	}
	v := find(&doc)
	if v == nil {
		t.Fatalf("%s: no data tidemark.yaml", file)
	}
	// A block scalar starts on the line after its indicator.
	checkConfigYAML(t, file, v.Line+1, v.Value, tree)
}

// ---------------------------------------------------------------------
// Metrics.

// metricDef is a metric that the binary's packages define.
type metricDef struct {
	name   string
	kind   string   // counter, gauge, histogram, summary, untyped; "" when unknown
	labels []string // variable labels
	known  bool     // the labels are known
	where  string
}

// binaryMetrics finds the metrics that the packages linked into tidemark
// define, by reading their source: the Name of every prometheus.*Opts
// literal and the name of every prometheus.NewDesc, with the type and the
// labels the source states (the Opts type, the label list of the
// constructor or of NewDesc, the value type a collector sends its Desc
// with); what it does not state as literals is not compared.
//
// A scrape of a running service would not do: vectors without children
// and the collectors that read the warehouse export nothing until there
// is something to report, and starting every component (Kafka, poll,
// CDC, aggregates, retention) needs both servers and takes seconds.
// Building each component with a registry that records its descriptions
// would need a copy of the service's wiring, which would drift. Reading
// the source sees every definition, fast and without servers; it only
// cannot see a name computed at run time, so a definition whose name is
// not a string literal fails the test instead of being skipped.
func binaryMetrics(t *testing.T, root string) map[string]*metricDef {
	t.Helper()
	module := ""
	for _, l := range readLines(t, root, "go.mod") {
		if m, ok := strings.CutPrefix(l, "module "); ok {
			module = strings.TrimSpace(m)
		}
	}
	if module == "" {
		t.Fatal("go.mod has no module line")
	}
	out := map[string]*metricDef{}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	queue := []string{"cmd/tidemark"}
	str := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil
	}
	strs := func(e ast.Expr) ([]string, bool) {
		if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
			return []string{}, true
		}
		cl, ok := e.(*ast.CompositeLit)
		if !ok {
			return nil, false
		}
		out := []string{}
		for _, el := range cl.Elts {
			s, ok := str(el)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	prom := func(e ast.Expr, names ...string) string {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return ""
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
			return ""
		}
		if len(names) > 0 && !slices.Contains(names, sel.Sel.Name) {
			return ""
		}
		return sel.Sel.Name
	}
	add := func(pos token.Pos, name, kind string) *metricDef {
		p := fset.Position(pos)
		rel, _ := filepath.Rel(root, p.Filename)
		where := fmt.Sprintf("%s:%d", filepath.ToSlash(rel), p.Line)
		if m := out[name]; m != nil {
			return m
		}
		m := &metricDef{name: name, kind: kind, where: where}
		out[name] = m
		return m
	}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		if seen[dir] {
			continue
		}
		seen[dir] = true
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			if ok, err := build.Default.MatchFile(filepath.Join(root, dir), name); err != nil || !ok {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(root, dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if rest, ok := strings.CutPrefix(p, module+"/"); ok {
					queue = append(queue, rest)
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					opts := prom(n.Type)
					if !strings.HasSuffix(opts, "Opts") {
						return true
					}
					var name string
					nameOK := false
					for _, el := range n.Elts {
						kv, ok := el.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						switch key := kv.Key.(*ast.Ident); {
						case key == nil:
						case key.Name == "Name":
							name, nameOK = str(kv.Value)
						case key.Name == "Namespace" || key.Name == "Subsystem":
							t.Errorf("%s: prometheus.%s with %s: these checks read only Name; write the whole name there",
								fset.Position(kv.Pos()), opts, key.Name)
						}
					}
					if !nameOK {
						t.Errorf("%s: prometheus.%s without a string literal Name: these checks cannot see the metric's name", fset.Position(n.Pos()), opts)
						return true
					}
					kind := strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(opts, "Opts"), "Vec"))
					add(n.Pos(), name, kind)
				case *ast.CallExpr:
					if prom(n.Fun, "NewDesc") != "" {
						name, ok := str(n.Args[0])
						if !ok {
							t.Errorf("%s: prometheus.NewDesc without a string literal name: these checks cannot see the metric's name", fset.Position(n.Pos()))
							return true
						}
						m := add(n.Pos(), name, "")
						if len(n.Args) >= 3 {
							m.labels, m.known = strs(n.Args[2])
						}
						return true
					}
					// NewCounterVec(opts, []string{"label"}) and the like.
					if len(n.Args) == 0 {
						return true
					}
					cl, ok := n.Args[0].(*ast.CompositeLit)
					if !ok || !strings.HasSuffix(prom(cl.Type), "Opts") {
						return true
					}
					var name string
					for _, el := range cl.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Name" {
								name, _ = str(kv.Value)
							}
						}
					}
					if name == "" {
						return true
					}
					m := add(cl.Pos(), name, strings.ToLower(strings.TrimSuffix(prom(cl.Type), "Opts")))
					switch {
					case len(n.Args) == 1:
						m.labels, m.known = []string{}, true
					case len(n.Args) == 2:
						m.labels, m.known = strs(n.Args[1])
					}
				}
				return true
			})
			// A collector's Desc gets its type where the collector
			// sends it: MustNewConstMetric(c.age, prometheus.GaugeValue, ...),
			// with age: prometheus.NewDesc("name", ...) in the same file.
			descs := map[string]string{}
			ast.Inspect(f, func(n ast.Node) bool {
				if kv, ok := n.(*ast.KeyValueExpr); ok {
					key, ok1 := kv.Key.(*ast.Ident)
					call, ok2 := kv.Value.(*ast.CallExpr)
					if ok1 && ok2 && prom(call.Fun, "NewDesc") != "" {
						if name, ok := str(call.Args[0]); ok {
							descs[key.Name] = name
						}
					}
				}
				return true
			})
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || prom(call.Fun, "MustNewConstMetric", "NewConstMetric") == "" || len(call.Args) < 2 {
					return true
				}
				field, ok := call.Args[0].(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if m := out[descs[field.Sel.Name]]; m != nil && m.kind == "" {
					m.kind = strings.ToLower(strings.TrimSuffix(prom(call.Args[1]), "Value"))
				}
				return true
			})
		}
	}
	return out
}

// exported are the names a scrape can show: a histogram's family also
// gives name_bucket, name_sum and name_count, a summary's name_sum and
// name_count.
func exported(defs map[string]*metricDef) map[string]bool {
	out := map[string]bool{}
	for name, m := range defs {
		out[name] = true
		switch m.kind {
		case "histogram":
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case "summary":
			out[name+"_sum"], out[name+"_count"] = true, true
		}
	}
	return out
}

var (
	metricRe = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.])(tidemark_[a-z0-9_]+)(\*?)`)
	parenRe  = regexp.MustCompile(`\([^)]*\)`)
)

// TestDocsMetrics checks that every metric name in the docs and the
// alerting rules is one that the binary defines, and that the metrics
// table of docs/metrics.md lists every metric with its type and labels.
func TestDocsMetrics(t *testing.T) {
	root := repoRoot(t)
	defs := binaryMetrics(t, root)
	names := exported(defs)
	if len(defs) < 10 {
		t.Fatalf("found only %d metric definitions in the binary's packages", len(defs))
	}
	files := append(docFiles(t, root), "deploy/prometheus/alerts.yaml", "deploy/prometheus/alerts_test.yaml")
	for _, file := range files {
		for i, l := range readLines(t, root, file) {
			for _, m := range metricRe.FindAllStringSubmatch(l, -1) {
				name, wildcard := m[1], m[2] == "*"
				if _, ok := notMetrics[name]; ok {
					continue
				}
				if wildcard {
					found := false
					for n := range names {
						found = found || strings.HasPrefix(n, name)
					}
					if !found {
						t.Errorf("%s:%d: no metric of the binary begins with %s", file, i+1, name)
					}
					continue
				}
				if !names[name] {
					t.Errorf("%s:%d: %s is not a metric of the binary%s", file, i+1, name, suggestMetric(name, names))
				}
			}
		}
	}

	// The metrics table: | `name` | type | labels | meaning |.
	const opsFile = metricsFile
	ops := parseMarkdown(t, root, opsFile)
	rows := map[string]mdRow{}
	var tableLine int
	for _, tb := range ops.tables {
		if tb.h2 != "Metrics" || len(tb.header) < 3 || tb.header[0] != "Name" {
			continue
		}
		tableLine = tb.line
		for _, r := range tb.rows {
			sp := codeSpans(r.cells[0])
			if len(sp) == 0 {
				t.Errorf("%s:%d: a row of the metrics table has no `name`", opsFile, r.line)
				continue
			}
			rows[sp[0].text] = r
		}
	}
	if tableLine == 0 {
		t.Fatalf("%s: no metrics table (first column Name) under ## Metrics", opsFile)
	}
	for _, name := range sortedKeys(defs) {
		m := defs[name]
		if !strings.HasPrefix(name, "tidemark_") {
			continue
		}
		r, ok := rows[name]
		if !ok {
			t.Errorf("%s:%d: the metrics table does not list %s (%s, defined at %s)", opsFile, tableLine, name, describeMetric(m), m.where)
			continue
		}
		if len(r.cells) < 3 {
			t.Errorf("%s:%d: the row of %s has fewer than three columns", opsFile, r.line, name)
			continue
		}
		if kind := strings.TrimSpace(r.cells[1]); m.kind != "" && kind != m.kind {
			t.Errorf("%s:%d: %s is a %s, not a %s (defined at %s)", opsFile, r.line, name, m.kind, kind, m.where)
		}
		if m.known {
			// Label names are the code spans outside parentheses; those
			// inside list values.
			cell := parenRe.ReplaceAllString(r.cells[2], "")
			var doc []string
			for _, sp := range codeSpans(cell) {
				doc = append(doc, sp.text)
			}
			want := slices.Clone(m.labels)
			sort.Strings(doc)
			sort.Strings(want)
			if !slices.Equal(doc, want) {
				t.Errorf("%s:%d: %s has the labels [%s], the table says [%s] (defined at %s)", opsFile, r.line, name,
					strings.Join(want, ", "), strings.Join(doc, ", "), m.where)
			}
		}
	}
}

func describeMetric(m *metricDef) string {
	kind := m.kind
	if kind == "" {
		kind = "collected"
	}
	if m.known && len(m.labels) > 0 {
		return fmt.Sprintf("%s with labels %s", kind, strings.Join(m.labels, ", "))
	}
	return kind
}

// suggestMetric names the closest metric for a misspelt one.
func suggestMetric(name string, names map[string]bool) string {
	best, bestScore := "", 0
	for n := range names {
		score := 0
		for score < len(n) && score < len(name) && n[score] == name[score] {
			score++
		}
		if score > bestScore || (score == bestScore && n < best) {
			best, bestScore = n, score
		}
	}
	if bestScore < len("tidemark_")+4 {
		return ""
	}
	return "; did you mean " + best + "?"
}

// userDocs are the documents users read, relative to the repository
// root: docFiles and the changelog.
func userDocs(t *testing.T, root string) []string {
	t.Helper()
	return append(docFiles(t, root), "CHANGELOG.md")
}

// goTestNameRe matches the names of Go tests; nameRe those of fuzz
// targets and benchmarks, which users run (make fuzz, make bench).
var (
	goTestNameRe = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`)
	nameRe       = regexp.MustCompile(`\b(?:Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*`)
)

// definedFuncs are the top-level functions of the repository's _test.go
// files, each with the directories (relative, slash-separated) that
// declare it.
func definedFuncs(t *testing.T, root string) map[string][]string {
	t.Helper()
	defined := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				defined[fn.Name.Name] = append(defined[fn.Name.Name], filepath.ToSlash(dir))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defined
}

// TestDocsNameTests checks that every fuzz target and benchmark the docs
// name exists: a renamed or deleted one must take its mention with it.
func TestDocsNameTests(t *testing.T) {
	root := repoRoot(t)
	defined := definedFuncs(t, root)
	for _, file := range userDocs(t, root) {
		for i, line := range readLines(t, root, file) {
			for _, loc := range nameRe.FindAllStringIndex(line, -1) {
				name := line[loc[0]:loc[1]]
				if len(defined[name]) > 0 {
					continue
				}
				if loc[1] < len(line) && line[loc[1]] == '*' && definedPrefix(defined, name) {
					continue // BenchmarkCDC*: a family
				}
				t.Errorf("%s:%d: names %s, which no _test.go file defines", file, i+1, name)
			}
		}
	}
}

// TestDocsNoTestNames checks that the user docs name no Go test: what a
// test shows is said in prose, and the test's name belongs in the code.
func TestDocsNoTestNames(t *testing.T) {
	root := repoRoot(t)
	for _, file := range userDocs(t, root) {
		for i, line := range readLines(t, root, file) {
			for _, name := range goTestNameRe.FindAllString(line, -1) {
				t.Errorf("%s:%d: names the Go test %s; say what it shows instead, and leave its name to the code", file, i+1, name)
			}
		}
	}
}

func definedPrefix(defined map[string][]string, prefix string) bool {
	for name := range defined {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------
// Alerts and the runbook.

// alertRule is an alerting rule of deploy/prometheus/alerts.yaml.
type alertRule struct {
	name        string
	line        int
	annotations map[string]string
}

func alertRules(t *testing.T, root string) []alertRule {
	t.Helper()
	const file = "deploy/prometheus/alerts.yaml"
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert       yaml.Node         `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []alertRule
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert.Value == "" {
				continue // a recording rule
			}
			out = append(out, alertRule{name: r.Alert.Value, line: r.Alert.Line, annotations: r.Annotations})
		}
	}
	if len(out) < 10 {
		t.Fatalf("%s: found only %d alerts", file, len(out))
	}
	return out
}

var (
	// runbookRefRe finds a reference to a runbook section in an alert's
	// annotation: See "The warehouse is down" in the runbook.
	runbookRefRe = regexp.MustCompile(`"([^"]+)"\s+in\s+the\s+runbook`)
	alertNameRe  = regexp.MustCompile(`\bTidemark[A-Z][A-Za-z0-9]*\b`)
)

// TestDocsRunbookAlerts checks that every alert of
// deploy/prometheus/alerts.yaml has a section of its own, named after it,
// under "## Alerts" in docs/runbook.md, that every runbook section an
// alert's annotations name exists, and that every alert the docs name and
// every section under "## Alerts" is an alert of the rules.
func TestDocsRunbookAlerts(t *testing.T) {
	root := repoRoot(t)
	rules := alertRules(t, root)
	rb := parseMarkdown(t, root, runbookFile)
	headings := map[string]bool{}
	alertSections := map[string]int{}
	for _, h := range rb.headings {
		headings[h.text] = true
		if h.level == 3 && h.h2 == "Alerts" {
			alertSections[h.text] = h.line
		}
	}
	known := map[string]bool{}
	for _, r := range rules {
		known[r.name] = true
		if alertSections[r.name] == 0 {
			t.Errorf("deploy/prometheus/alerts.yaml:%d: the alert %s has no section \"### %s\" under \"## Alerts\" in %s", r.line, r.name, r.name, runbookFile)
		}
		for _, key := range sortedKeys(r.annotations) {
			for _, m := range runbookRefRe.FindAllStringSubmatch(strings.Join(strings.Fields(r.annotations[key]), " "), -1) {
				if !headings[m[1]] {
					t.Errorf("deploy/prometheus/alerts.yaml:%d: the %s of %s names the runbook section %q, which %s does not have", r.line, key, r.name, m[1], runbookFile)
				}
			}
		}
	}
	for _, name := range sortedKeys(alertSections) {
		if !known[name] {
			t.Errorf("%s:%d: the section %q under \"## Alerts\" is not an alert of deploy/prometheus/alerts.yaml", runbookFile, alertSections[name], name)
		}
	}
	for _, file := range userDocs(t, root) {
		for i, line := range readLines(t, root, file) {
			for _, name := range alertNameRe.FindAllString(line, -1) {
				if !known[name] {
					t.Errorf("%s:%d: %s is not an alert of deploy/prometheus/alerts.yaml", file, i+1, name)
				}
			}
		}
	}
}

// ---------------------------------------------------------------------
// Links.

var (
	// mdLinkRe finds inline links and images: [text](target).
	mdLinkRe = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	// slugDropRe is what GitHub drops from a heading to make its anchor.
	slugDropRe = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// anchors are the anchors GitHub gives a document's headings: the text
// lowercased, punctuation dropped, spaces made hyphens, and -1, -2 ...
// appended to repeats.
func anchors(d *mdDoc) map[string]bool {
	out := map[string]bool{}
	for _, h := range d.headings {
		text := html.UnescapeString(h.text)
		slug := strings.ReplaceAll(slugDropRe.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		a := slug
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", slug, n)
		}
		out[a] = true
	}
	return out
}

// TestDocsLinks checks that every relative link of the user docs and of
// docs/configuration.md names a file that exists and, for a document, a
// heading it has.
func TestDocsLinks(t *testing.T) {
	root := repoRoot(t)
	docs := map[string]*mdDoc{}
	doc := func(rel string) *mdDoc {
		if docs[rel] == nil {
			docs[rel] = parseMarkdown(t, root, rel)
		}
		return docs[rel]
	}
	files := userDocs(t, root)
	if !slices.Contains(files, "docs/configuration.md") {
		files = append(files, "docs/configuration.md")
	}
	for _, file := range files {
		d := doc(file)
		for _, p := range d.prose {
			for _, loc := range mdLinkRe.FindAllStringSubmatchIndex(p.text, -1) {
				target := p.text[loc[2]:loc[3]]
				line := p.line + strings.Count(p.text[:loc[0]], "\n")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				rel := file
				if path != "" {
					rel = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
						t.Errorf("%s:%d: the link %s names %s, which does not exist", file, line, target, rel)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(rel, ".md") {
					t.Errorf("%s:%d: the link %s has an anchor into a file that is not a document", file, line, target)
					continue
				}
				if !anchors(doc(rel))[anchor] {
					t.Errorf("%s:%d: the link %s names #%s, which no heading of %s has", file, line, target, anchor, rel)
				}
			}
		}
	}
}

// ---------------------------------------------------------------------
// The deploy example.

// commentedKeyRe matches a commented-out key or list item of
// deploy/tidemark.example.yaml: the "#" stands where the key would be
// indented, one space follows it.
var commentedKeyRe = regexp.MustCompile(`^(\s*)# ?(\s*(?:- |[a-z_][a-z0-9_]*:(?:\s|$)).*)$`)

// TestDeployExampleNamesEveryKey checks that deploy/tidemark.example.yaml
// shows every key of config.Keys, set or commented out, that it names no
// other key, and that a key with a default shows it: as its value or as
// "default X" in its comment, at one place at least; and that it loads
// with config.Parse as it stands, every secret from the environment.
func TestDeployExampleNamesEveryKey(t *testing.T) {
	root := repoRoot(t)
	const file = "deploy/tidemark.example.yaml"
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	env := func(name string) (string, bool) {
		if strings.HasSuffix(name, "DATABASE_URL") {
			return "postgres://tidemark@db.example.com/warehouse", true
		}
		return "secret", true
	}
	if _, err := config.Parse(file, b, env); err != nil {
		t.Errorf("%s: %v", file, err)
	}
	// Uncomment the commented-out keys, keeping the line numbers.
	raw := strings.Split(string(b), "\n")
	lines := slices.Clone(raw)
	for i, l := range lines {
		if m := commentedKeyRe.FindStringSubmatch(l); m != nil {
			lines[i] = m[1] + m[2]
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &doc); err != nil {
		t.Fatalf("%s, its commented-out keys uncommented: %v", file, err)
	}
	keys := config.Keys()
	// match is the pattern of config.Keys that the path segs is, or
	// begins, with <name> matching any map key.
	match := func(segs []string, whole bool) string {
		for _, k := range keys {
			p := strings.Split(k.Path, ".")
			if len(p) < len(segs) || whole && len(p) != len(segs) {
				continue
			}
			ok := true
			for i, s := range segs {
				ok = ok && (p[i] == s || p[i] == "<name>")
			}
			if ok {
				return strings.Join(p[:len(segs)], ".")
			}
		}
		return ""
	}
	shown := map[string][]int{} // pattern → lines
	var walk func(n *yaml.Node, segs []string)
	walk = func(n *yaml.Node, segs []string) {
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := append(segs[:len(segs):len(segs)], k.Value)
			p := match(path, false)
			if p == "" {
				t.Errorf("%s:%d: %s is not a configuration key", file, k.Line, strings.Join(path, "."))
				continue
			}
			if whole := match(path, true); whole != "" {
				shown[whole] = append(shown[whole], k.Line)
				continue
			}
			walk(v, path)
		}
	}
	walk(doc.Content[0], nil)
	for _, k := range keys {
		at, ok := shown[k.Path]
		if !ok {
			t.Errorf("%s: the key %s is not shown; its row:\n%s", file, k.Path, keyRow(k.Path, k))
			continue
		}
		if k.Default == "" {
			continue
		}
		found := false
		for _, l := range at {
			text := raw[l-1]
			_, value, _ := strings.Cut(text, ":")
			value, comment, _ := strings.Cut(value, "#")
			found = found || strings.TrimSpace(value) == k.Default || strings.Contains(comment, "default "+k.Default)
		}
		if !found {
			t.Errorf("%s:%d: the key %s does not show its default: give it the value %s or say \"default %s\" in its comment",
				file, at[0], k.Path, k.Default, k.Default)
		}
	}
}

// ---------------------------------------------------------------------
// Supported PostgreSQL versions.

// versionsDoc holds the table of supported PostgreSQL versions, under
// versionsHeading.
const (
	versionsDoc     = "docs/design.md"
	versionsHeading = "Supported PostgreSQL versions"
)

// versionSuites are the suites that make test-matrix must run for the
// table to claim a version as a warehouse, and as a CDC or poll source.
var versionSuites = map[string][]string{
	"As a warehouse":          {"./ingest/kafka/", "./raw/", "./reconcile/", "./aggregate/", "./migrate/", "./grants/", "./retention/", "./backfill/"},
	"As a CDC or poll source": {"./cdc/", "./ingest/poll/", "./mirror/"},
}

// makeDefaultRe matches a variable's default in the Makefile: NAME ?= value.
var makeDefaultRe = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)\s*\?=\s*(.*?)\s*$`)

// makeDefaults are the Makefile's variables with a default (NAME ?=
// value), by name.
func makeDefaults(t *testing.T, root string) map[string]string {
	t.Helper()
	defaults := map[string]string{}
	for _, l := range readLines(t, root, "Makefile") {
		if m := makeDefaultRe.FindStringSubmatch(l); m != nil {
			defaults[m[1]] = m[2]
		}
	}
	return defaults
}

// makeCall is a make command of .ci/run: its target and the variables it
// sets.
type makeCall struct {
	line   int
	text   string
	target string
	vars   map[string]string
}

// ciMakeCalls returns the make commands of .ci/run.
func ciMakeCalls(t *testing.T, root string) []makeCall {
	t.Helper()
	var calls []makeCall
	for i, l := range readLines(t, root, ".ci/run") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "make ") {
			continue
		}
		words, err := shellWords(l)
		if err != nil {
			t.Fatalf(".ci/run:%d: %v", i+1, err)
		}
		c := makeCall{line: i + 1, text: l, vars: map[string]string{}}
		for _, w := range words[1:] {
			if name, value, ok := strings.Cut(w, "="); ok && makeDefaultRe.MatchString(name+" ?= ") {
				c.vars[name] = value
			} else if c.target == "" && !strings.HasPrefix(w, "-") {
				c.target = w
			}
		}
		calls = append(calls, c)
	}
	return calls
}

// shellWords splits a simple shell command line into words: blanks
// separate them, and single or double quotes keep blanks inside one.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			w.WriteByte(c)
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		case c == '$' || c == '`' || c == '\\' || c == ';' || c == '&' || c == '|':
			return nil, fmt.Errorf("%q: only plain words and quotes are understood here", line)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("%q: unclosed quote", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// TestDocsPostgresVersions checks the table of supported PostgreSQL
// versions against what CI runs, so that the two cannot drift: .ci/run's
// make test PG=N names the default version, and its make test-matrix the
// others (the Makefile's PG_VERSIONS and MATRIX_PACKAGES, unless the call
// sets them). The table has one row per version CI runs and no other;
// each cell names the target that runs its version, and a version is
// claimed as a warehouse, or as a source, only if the matrix runs the
// suites that show it. The section quotes the matrix's command as CI
// runs it.
func TestDocsPostgresVersions(t *testing.T) {
	root := repoRoot(t)
	defaults := makeDefaults(t, root)
	var dflt string
	var matrix *makeCall
	for _, c := range ciMakeCalls(t, root) {
		switch c.target {
		case "test":
			if c.vars["PG"] == "" {
				t.Errorf(".ci/run:%d: %s: CI's make test must name the default version (PG=N) that the table states", c.line, c.text)
			}
			dflt = c.vars["PG"]
		case "test-matrix":
			if matrix != nil {
				t.Errorf(".ci/run:%d: a second make test-matrix", c.line)
			}
			matrix = &c
		}
	}
	if dflt == "" || matrix == nil {
		t.Fatalf(".ci/run runs no make test PG=N or no make test-matrix: the table of %s has nothing to be checked against", versionsDoc)
	}
	setting := func(name string) []string {
		if v, ok := matrix.vars[name]; ok {
			return strings.Fields(v)
		}
		v, ok := defaults[name]
		if !ok {
			t.Fatalf("Makefile: no default for %s (%s ?= ...)", name, name)
		}
		return strings.Fields(v)
	}
	matrixVersions, packages := setting("PG_VERSIONS"), setting("MATRIX_PACKAGES")
	if slices.Contains(matrixVersions, dflt) {
		t.Errorf("PostgreSQL %s is both the default (make test) and in the matrix: run it once", dflt)
	}
	ran := map[string]string{dflt: "make test"}
	for _, v := range matrixVersions {
		ran[v] = "make test-matrix"
	}

	d := parseMarkdown(t, root, versionsDoc)
	var table *mdTable
	for i := range d.tables {
		if d.tables[i].heading == versionsHeading {
			table = &d.tables[i]
		}
	}
	if table == nil {
		t.Fatalf("%s: no table under the heading %q", versionsDoc, versionsHeading)
	}
	header := []string{"Version", "As a warehouse", "As a CDC or poll source", "Notes"}
	if !slices.Equal(table.header, header) {
		t.Fatalf("%s:%d: the table's columns are %q, want %q", versionsDoc, table.line, table.header, header)
	}
	listed := map[string]bool{}
	for _, r := range table.rows {
		v := cellAt(r.cells, 0)
		listed[v] = true
		target, ok := ran[v]
		if !ok {
			t.Errorf("%s:%d: PostgreSQL %q is in the table, but CI runs no test on it (.ci/run, Makefile PG_VERSIONS)", versionsDoc, r.line, v)
			continue
		}
		for col := 1; col <= 2; col++ {
			cell := cellAt(r.cells, col)
			if !strings.Contains(cell, "`"+target+"`") {
				t.Errorf("%s:%d: PostgreSQL %s, %s: %q does not name `%s`, which is what CI runs on it", versionsDoc, r.line, v, header[col], cell, target)
			}
			if target != "make test-matrix" {
				continue
			}
			for _, p := range versionSuites[header[col]] {
				if !slices.Contains(packages, p) {
					t.Errorf("%s:%d: PostgreSQL %s is claimed %s, but make test-matrix as CI runs it does not test %s", versionsDoc, r.line, v, strings.TrimPrefix(header[col], "As "), p)
				}
			}
		}
	}
	for _, v := range slices.Sorted(maps.Keys(ran)) {
		if !listed[v] {
			t.Errorf("%s: CI runs %s on PostgreSQL %s, which the table of supported versions does not list", versionsDoc, ran[v], v)
		}
	}
	quoted := false
	for _, s := range d.spans {
		quoted = quoted || (s.h2 == versionsHeading && s.text == matrix.text)
	}
	if !quoted {
		t.Errorf("%s: the section %q does not quote the matrix as CI runs it: `%s` (.ci/run:%d)", versionsDoc, versionsHeading, matrix.text, matrix.line)
	}
}

// TestReadmeFirstConfiguration: the configuration the README starts with
// is one that tidemark loads, with the warehouse from
// TIDEMARK_DATABASE_URL as the README says, and has a schema-registry
// source and an aggregate over it.
func TestReadmeFirstConfiguration(t *testing.T) {
	cfg, line := loadDocConfig(t, "README.md", "A first configuration")
	registry, aggregates := false, len(cfg.Aggregates) > 0
	for _, name := range cfg.SourceNames() {
		registry = registry || config.UsesRegistry(cfg.Sources[name].Format)
	}
	if !registry || !aggregates {
		t.Errorf("README.md:%d: the first configuration has a schema-registry source: %v, an aggregate: %v; want both", line, registry, aggregates)
	}
}

// TestDocsCompleteExample: configuration.md's complete example loads,
// with its secrets from the environment and files it names.
func TestDocsCompleteExample(t *testing.T) {
	cfg, line := loadDocConfig(t, "docs/configuration.md", "Complete example")
	if len(cfg.Sources) < 2 || len(cfg.Aggregates) < 2 {
		t.Errorf("docs/configuration.md:%d: %d sources and %d aggregates; the example shows a Kafka and a CDC source and two aggregates", line, len(cfg.Sources), len(cfg.Aggregates))
	}
}

// loadDocConfig loads, as tidemark would, the first YAML block of file
// under the level-2 heading h2, with the environment variables such
// examples name set and the files they name readable; it returns the
// configuration and the block's line.
func loadDocConfig(t *testing.T, file, h2 string) (*config.Config, int) {
	t.Helper()
	d := parseMarkdown(t, repoRoot(t), file)
	var text strings.Builder
	block, line := 0, 0
	for _, s := range d.code {
		if s.h2 != h2 || s.lang != "yaml" || (block != 0 && s.block != block) {
			continue
		}
		if block == 0 {
			block, line = s.block, s.line
		}
		text.WriteString(s.text + "\n")
	}
	if block == 0 {
		t.Fatalf("%s: no YAML block under ## %s", file, h2)
	}
	env := map[string]string{
		"TIDEMARK_DATABASE_URL": "postgres://tidemark@db.example.com/warehouse",
		"SHOP_DATABASE_URL":     "postgres://tidemark@shop.example.com/shop",
	}
	yamlText := text.String()
	// The secret files an example names are written in a directory of
	// the test, and the example reads them from there.
	dir := t.TempDir()
	for _, m := range regexp.MustCompile(`/run/secrets/[\w.-]+`).FindAllString(yamlText, -1) {
		local := filepath.Join(dir, filepath.Base(m))
		if err := os.WriteFile(local, []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		yamlText = strings.ReplaceAll(yamlText, m, local)
	}
	cfg, err := config.Parse(file, []byte(yamlText), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("%s:%d: the configuration does not load: %v", file, line, err)
	}
	return cfg, line
}
