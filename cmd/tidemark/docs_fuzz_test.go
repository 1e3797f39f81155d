package main

import (
	"path"
	"slices"
	"strings"
	"testing"
)

// fuzzDoc and fuzzHeading are where the fuzz targets are listed, one
// table row each, named package.Target.
const (
	fuzzDoc     = "docs/security.md"
	fuzzHeading = "Untrusted input"
)

// TestDocsFuzzTargets: every fuzz target of the source is in the
// Makefile's FUZZ_TARGETS, so that make fuzz and CI's make fuzz-short run
// it, and in the table of docs/security.md with what it checks; neither
// names a target that is not there.
func TestDocsFuzzTargets(t *testing.T) {
	root := repoRoot(t)
	inSource := map[string]bool{} // dir:Target, as FUZZ_TARGETS spells it
	for name, dirs := range definedFuncs(t, root) {
		if strings.HasPrefix(name, "Fuzz") {
			for _, dir := range dirs {
				inSource[dir+":"+name] = true
			}
		}
	}
	if len(inSource) == 0 {
		t.Fatal("no fuzz targets found in the source")
	}

	targets := strings.Fields(makeDefaults(t, root)["FUZZ_TARGETS"])
	if len(targets) == 0 {
		t.Fatal("Makefile: no FUZZ_TARGETS ?= ...")
	}
	for _, tg := range targets {
		if !inSource[tg] {
			t.Errorf("Makefile: FUZZ_TARGETS names %s, which no _test.go declares", tg)
		}
	}
	for tg := range inSource {
		if !slices.Contains(targets, tg) {
			t.Errorf("%s is not in the Makefile's FUZZ_TARGETS: make fuzz and CI do not run it", tg)
		}
	}

	documented := map[string]bool{} // package.Target
	d := parseMarkdown(t, root, fuzzDoc)
	for _, tb := range d.tables {
		if tb.heading != fuzzHeading {
			continue
		}
		for _, r := range tb.rows {
			for _, sp := range codeSpans(r.cells[0]) {
				documented[sp.text] = true
			}
		}
	}
	want := map[string]bool{}
	for tg := range inSource {
		dir, name, _ := strings.Cut(tg, ":")
		want[path.Base(dir)+"."+name] = true
	}
	for name := range want {
		if !documented[name] {
			t.Errorf("%s: the table under %q lacks %s", fuzzDoc, fuzzHeading, name)
		}
	}
	for name := range documented {
		if !want[name] {
			t.Errorf("%s: the table under %q names %s, which is no fuzz target", fuzzDoc, fuzzHeading, name)
		}
	}
}
