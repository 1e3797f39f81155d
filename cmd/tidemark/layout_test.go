package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// module is the import path of this module.
const module = "github.com/tidemark-dev/tidemark"

// goFile is one non-test Go file of the module, parsed.
type goFile struct {
	dir  string // relative to the module root, slash-separated
	path string
	ast  *ast.File
	fset *token.FileSet
}

// moduleFiles parses every non-test Go file of the module.
func moduleFiles(t *testing.T) []goFile {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []goFile
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		files = append(files, goFile{dir: filepath.ToSlash(rel), path: path, ast: f, fset: fset})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found %d Go files under %s: not the module root", len(files), root)
	}
	return files
}

// imports lists the module's own packages that f imports, relative to the
// module root ("raw", "internal/pgerr").
func (f goFile) imports() []string {
	var out []string
	for _, imp := range f.ast.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if rel, ok := strings.CutPrefix(p, module+"/"); ok {
			out = append(out, rel)
		}
	}
	return out
}

func under(dir, prefix string) bool { return dir == prefix || strings.HasPrefix(dir, prefix+"/") }

// layoutRules are the import rules of the package layout: a package in
// dir (or below it) must not import a package that forbidden reports.
var layoutRules = []struct {
	dir       string
	why       string
	forbidden func(imp string) bool
}{
	{"internal", "internal/ holds leaf libraries, and test harnesses under internal/testkit, only",
		func(imp string) bool { return !under(imp, "internal") }},
	{"ingest/decode", "a decoder knows nothing of how records arrive",
		func(imp string) bool { return under(imp, "ingest") && imp != "ingest/decode" }},
	{"ingest/kafka", "each way in is a package of its own",
		func(imp string) bool { return under(imp, "ingest/poll") }},
	{"ingest/poll", "each way in is a package of its own",
		func(imp string) bool { return under(imp, "ingest/kafka") || under(imp, "ingest/decode") }},
	{"raw", "the raw-table API lives apart from the ways in",
		func(imp string) bool { return under(imp, "ingest") || under(imp, "cdc") }},
	{"reconcile", "reconcile holds aggregates only; key reconciliation is in mirror",
		func(imp string) bool { return imp == "mirror" }},
	{"mirror", "mirrors know nothing of aggregates",
		func(imp string) bool { return imp == "reconcile" || imp == "aggregate" }},
}

// testkit holds the test harnesses: only tests and other harnesses import
// them, so none is linked into the binary.
const testkit = "internal/testkit"

// TestPackageLayout: the package layout's import rules hold.
func TestPackageLayout(t *testing.T) {
	for _, f := range moduleFiles(t) {
		if !under(f.dir, testkit) {
			for _, imp := range f.imports() {
				if under(imp, testkit) {
					t.Errorf("%s imports %s: test harnesses are for tests only", f.path, imp)
				}
			}
		}
		for _, rule := range layoutRules {
			if !under(f.dir, rule.dir) {
				continue
			}
			for _, imp := range f.imports() {
				if rule.forbidden(imp) {
					t.Errorf("%s imports %s: %s", f.path, imp, rule.why)
				}
			}
		}
	}
}

// TestSQLSTATEThroughClassifier: outside internal/pgerr, no code compares
// an error's SQLSTATE (a .Code field) with a string literal; the
// classifier's named constants say what a code means.
func TestSQLSTATEThroughClassifier(t *testing.T) {
	isCode := func(e ast.Expr) bool {
		s, ok := e.(*ast.SelectorExpr)
		return ok && s.Sel.Name == "Code"
	}
	isString := func(e ast.Expr) bool {
		l, ok := e.(*ast.BasicLit)
		return ok && l.Kind == token.STRING
	}
	for _, f := range moduleFiles(t) {
		if under(f.dir, "internal/pgerr") {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) &&
					(isCode(n.X) && isString(n.Y) || isString(n.X) && isCode(n.Y)) {
					t.Errorf("%s: an error code compared with a literal; use internal/pgerr", f.path)
				}
			case *ast.SwitchStmt:
				if n.Tag == nil || !isCode(n.Tag) {
					return true
				}
				for _, c := range n.Body.List {
					for _, v := range c.(*ast.CaseClause).List {
						if isString(v) {
							t.Errorf("%s: a switch on an error code has a literal case; use internal/pgerr", f.path)
						}
					}
				}
			}
			return true
		})
	}
}

// Function length limits: a function longer than maxFuncLines does more
// than one thing, and the service's Run is a list of components.
const (
	maxFuncLines       = 120
	maxServiceRunLines = 80
)

// TestFunctionLength: no non-test function is longer than maxFuncLines
// lines, and service.Run no longer than maxServiceRunLines.
func TestFunctionLength(t *testing.T) {
	runs := 0
	for _, f := range moduleFiles(t) {
		for _, d := range f.ast.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			lines := f.fset.Position(fd.End()).Line - f.fset.Position(fd.Pos()).Line + 1
			limit := maxFuncLines
			if f.dir == "service" && fd.Recv == nil && fd.Name.Name == "Run" {
				limit = maxServiceRunLines
				runs++
			}
			if lines > limit {
				t.Errorf("%s: %s is %d lines, more than %d: split it into named steps", f.path, fd.Name.Name, lines, limit)
			}
		}
	}
	if runs != 1 {
		t.Errorf("found %d functions service.Run, want 1", runs)
	}
}

// quoting is the one package that spells names and strings into SQL.
const quoting = "internal/pgquote"

// TestOneQuoting: identifiers and string literals are spelled into SQL by
// internal/pgquote alone. Outside it no function (a method may, as the
// JSON scanner's literal) is named quote... or literal..., and no code quotes with pgx.Identifier{...}.Sanitize(): a
// pgx.Identifier held as a value may still sanitise itself. pgserver's
// quoteConf spells configuration-file values, which are not SQL.
func TestOneQuoting(t *testing.T) {
	allowed := map[string]bool{"internal/pgserver.quoteConf": true}
	for _, f := range moduleFiles(t) {
		if f.dir == quoting {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				name := strings.ToLower(n.Name.Name)
				if n.Recv == nil && (strings.HasPrefix(name, "quote") || strings.HasPrefix(name, "literal")) && !allowed[f.dir+"."+n.Name.Name] {
					t.Errorf("%s: func %s: quote through %s", f.fset.Position(n.Pos()), n.Name.Name, quoting)
				}
			case *ast.SelectorExpr:
				lit, ok := n.X.(*ast.CompositeLit)
				if !ok || n.Sel.Name != "Sanitize" {
					return true
				}
				if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Identifier" {
					t.Errorf("%s: pgx.Identifier{...}.Sanitize(): use pgquote.Ident", f.fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}

// rawColumnListRe matches a raw table's column list written out: its
// first three columns in a row, in SQL or as Go strings.
var rawColumnListRe = regexp.MustCompile(`event_id"?,\s*"?event_time"?,\s*"?ingested_at`)

// TestRawShapeInRaw: the raw tables' shape is written in package raw
// alone. Their schema is a string there only (raw.Schema, raw.TableName,
// raw.TableIdent), and in the configuration's list of schemas that belong
// to tidemark, which a test of raw keeps in step; their column lists are
// raw.EventColumns and raw.ChangeColumns, which writers use, never a list
// of their own.
func TestRawShapeInRaw(t *testing.T) {
	for _, f := range moduleFiles(t) {
		if f.dir == "raw" {
			continue
		}
		src, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if rawColumnListRe.MatchString(line) {
				t.Errorf("%s:%d: a raw table's column list: use raw.EventColumns or raw.ChangeColumns", f.path, i+1)
			}
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok && f.dir == "config" && len(vs.Names) == 1 && vs.Names[0].Name == "reservedSchemas" {
				return false
			}
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && lit.Value == `"raw"` {
				t.Errorf(`%s: the string "raw": name the raw tables' schema with raw.Schema`, f.fset.Position(lit.Pos()))
			}
			return true
		})
	}
}

// TestOneMirrorWriter: changes are applied to mirrors by the one writer in
// package mirror (mirror.Changes, mirror.Writer). Its marks are a stage
// that empties itself at commit and a JSON row turned into a mirror's row
// type; elsewhere they appear only where named here, with the reason.
func TestOneMirrorWriter(t *testing.T) {
	allowed := map[string]string{
		// A poll source reloads complete rows of a window; its one
		// statement merges them and records the rows that changed.
		"ingest/poll": "the windowed merge of a poll source",
		// Corrections are rows of an aggregate, not of a mirror.
		"aggregate": "corrections read as an aggregate's rows",
	}
	for _, f := range moduleFiles(t) {
		if f.dir == "mirror" || allowed[f.dir] != "" {
			continue
		}
		src, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if strings.Contains(line, "ON COMMIT DELETE ROWS") || strings.Contains(line, "jsonb_populate_record") {
				t.Errorf("%s:%d: changes to a mirror are applied through mirror.Writer", f.path, i+1)
			}
		}
	}
}
