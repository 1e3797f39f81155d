// Package docsql reads the SQL that a documentation page gives the
// reader to run, so that a test runs it exactly as written.
package docsql

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

var blockRe = regexp.MustCompile("(?s)```sql\n(.*?)```")

// Statements returns the statements, one a line, of the first sql block
// under the heading "## "+section of the Markdown file page that mentions
// name; comment lines and blank lines are left out. It fails the test
// when there is no such block.
func Statements(tb testing.TB, page, section, name string) []string {
	tb.Helper()
	text, err := os.ReadFile(page)
	if err != nil {
		tb.Fatalf("docsql: %v", err)
	}
	sec := regexp.MustCompile(`(?s)\n## ` + regexp.QuoteMeta(section) + `\n(.*?)(\n## |$)`).FindSubmatch(text)
	if sec == nil {
		tb.Fatalf("docsql: %s has no section %q", page, section)
	}
	for _, block := range blockRe.FindAllSubmatch(sec[1], -1) {
		if !strings.Contains(string(block[1]), name) {
			continue
		}
		var stmts []string
		for _, line := range strings.Split(string(block[1]), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "--") {
				stmts = append(stmts, line)
			}
		}
		if len(stmts) > 0 {
			return stmts
		}
	}
	tb.Fatalf("docsql: %s: no sql block with a statement on %s under %q", page, name, section)
	return nil
}
