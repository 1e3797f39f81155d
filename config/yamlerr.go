package config

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a configuration file, located by key and line.
type Error struct {
	File string
	Line int    // 0 when unknown
	Key  string // dotted path, e.g. sources.app_events.event_time
	Msg  string
}

func (e Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if e.Key == "" {
		return loc + ": " + e.Msg
	}
	return loc + ": " + e.Key + ": " + e.Msg
}

// Errors is every problem found in a configuration file.
type Errors []Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// index maps key paths to the lines they are written on, and positions
// back to key paths, so that both decode errors (which know a line, and for
// tidemark's own types a column) and validation errors (which know a path)
// can name key and line.
type index struct {
	file     string
	lineOf   map[string]int
	valueOf  map[string]*yaml.Node
	entries  []entry
	problems Errors
}

// entry is one key and its value node.
type entry struct {
	path  string
	key   string
	line  int // of the key
	value *yaml.Node
}

func newIndex(file string, root *yaml.Node) *index {
	ix := &index{file: file, lineOf: map[string]int{}, valueOf: map[string]*yaml.Node{}}
	if root != nil && root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		ix.walk("", root.Content[0])
	}
	return ix
}

func (ix *index) walk(path string, n *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			ix.lineOf[p] = k.Line
			ix.valueOf[p] = v
			ix.entries = append(ix.entries, entry{path: p, key: k.Value, line: k.Line, value: v})
			ix.walk(p, v)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			ix.lineOf[p] = item.Line
			ix.entries = append(ix.entries, entry{path: p, line: item.Line, value: item})
			ix.walk(p, item)
		}
	}
}

// find returns the deepest entry on line that satisfies match.
func (ix *index) find(line int, match func(e entry) bool) string {
	best := ""
	for _, e := range ix.entries {
		if (e.line == line || e.value.Line == line) && match(e) && len(e.path) >= len(best) {
			best = e.path
		}
	}
	return best
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// line returns the line of path, or of its nearest written ancestor.
func (ix *index) line(path string) int {
	for p := path; p != ""; {
		if l, ok := ix.lineOf[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// text is the value at path as the file writes it, or else v formatted
// as the file would write it.
func (ix *index) text(path string, v reflect.Value) string {
	n := ix.valueOf[path]
	if n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return formatValue(v)
}

func (ix *index) add(path, format string, args ...any) {
	ix.problems = append(ix.problems, Error{File: ix.file, Line: ix.line(path), Key: path, Msg: fmt.Sprintf(format, args...)})
}

// The messages may span lines: yaml.v3 quotes a multi-line value as it is.
var (
	yamlLineRe     = regexp.MustCompile(`(?s)^(?:yaml: )?line (\d+): (?:column (\d+): )?(.*)$`)
	unknownFieldRe = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	cannotRe       = regexp.MustCompile("(?s)^cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
	cannotNodeRe   = regexp.MustCompile(`^cannot unmarshal !!(\w+) into (\S+)$`)
)

// decodeError turns a yaml.v3 decode error into located problems.
func (ix *index) decodeError(err error) {
	var msgs []string
	if te, ok := err.(*yaml.TypeError); ok {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	for _, m := range msgs {
		sub := yamlLineRe.FindStringSubmatch(m)
		if sub == nil {
			ix.problems = append(ix.problems, Error{File: ix.file, Msg: m})
			continue
		}
		line, _ := strconv.Atoi(sub[1])
		col, _ := strconv.Atoi(sub[2])
		msg := sub[3]
		any := func(entry) bool { return true }
		path := ix.find(line, any)
		switch u, c, cn := unknownFieldRe.FindStringSubmatch(msg), cannotRe.FindStringSubmatch(msg), cannotNodeRe.FindStringSubmatch(msg); {
		case col > 0:
			path = ix.find(line, func(e entry) bool { return e.value.Line == line && e.value.Column == col })
		case u != nil:
			msg = "unknown key"
			if p := ix.find(line, func(e entry) bool { return e.line == line && e.key == u[1] }); p != "" {
				path = p
			}
		case c != nil:
			msg = fmt.Sprintf("expected %s, got %s %q", describeGoType(c[3]), describeTag(c[1]), c[2])
			if p := ix.find(line, func(e entry) bool { return e.value.ShortTag() == "!!"+c[1] && e.value.Value == c[2] }); p != "" {
				path = p
			}
		case cn != nil:
			msg = fmt.Sprintf("expected %s, got %s", describeGoType(cn[2]), describeTag(cn[1]))
			if p := ix.find(line, func(e entry) bool { return e.value.ShortTag() == "!!"+cn[1] }); p != "" {
				path = p
			}
		}
		ix.problems = append(ix.problems, Error{File: ix.file, Line: line, Key: path, Msg: msg})
	}
}

func describeGoType(t string) string {
	switch {
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	case strings.HasPrefix(t, "float"):
		return "a number"
	}
	return "a mapping"
}

func describeTag(tag string) string {
	switch tag {
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	case "str":
		return "the string"
	case "int":
		return "the integer"
	case "bool":
		return "the boolean"
	case "float":
		return "the number"
	}
	return tag
}

func (ix *index) sorted() Errors {
	out := append(Errors(nil), ix.problems...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		return out[i].Key < out[j].Key
	})
	return out
}
