package config

import (
	"fmt"
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

// index maps key paths to the lines they are written on, and lines back to
// the deepest key path written there, so that both decode errors (which
// know only a line) and validation errors (which know only a path) can name
// key and line.
type index struct {
	file     string
	lineOf   map[string]int
	pathAt   map[int]string
	problems Errors
}

func newIndex(file string, root *yaml.Node) *index {
	ix := &index{file: file, lineOf: map[string]int{}, pathAt: map[int]string{}}
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
			ix.pathAt[k.Line] = p
			ix.walk(p, v)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			ix.lineOf[p] = item.Line
			if _, taken := ix.pathAt[item.Line]; !taken {
				ix.pathAt[item.Line] = p
			}
			ix.walk(p, item)
		}
	}
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

func (ix *index) add(path, format string, args ...any) {
	ix.problems = append(ix.problems, Error{File: ix.file, Line: ix.line(path), Key: path, Msg: fmt.Sprintf(format, args...)})
}

var (
	yamlLineRe     = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
	unknownFieldRe = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	cannotRe       = regexp.MustCompile("^cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
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
		msg := sub[2]
		path := ix.pathAt[line]
		if u := unknownFieldRe.FindStringSubmatch(msg); u != nil {
			msg = "unknown key"
			if path == "" {
				path = u[1]
			}
		} else if c := cannotRe.FindStringSubmatch(msg); c != nil {
			msg = fmt.Sprintf("expected %s, got %s %q", describeGoType(c[3]), describeTag(c[1]), c[2])
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
