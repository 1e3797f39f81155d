// Package testenv is how tests treat what the machine may lack (a
// program, a server feature): they skip, saying what to install, unless
// the environment variable TIDEMARK_REQUIRE_<NAME> is set, as CI sets it
// for everything it installs, in which case they fail. A test never skips
// silently where CI is meant to run it.
package testenv

import (
	"os"
	"testing"
)

// Missing skips tb because what is named name (KCAT, CHROMIUM, PROMTOOL,
// ICU) is not available, or fails it when TIDEMARK_REQUIRE_<name> is set.
func Missing(tb testing.TB, name, why string) {
	tb.Helper()
	if os.Getenv("TIDEMARK_REQUIRE_"+name) != "" {
		tb.Fatalf("%s (TIDEMARK_REQUIRE_%s is set)", why, name)
	}
	tb.Skip(why)
}
