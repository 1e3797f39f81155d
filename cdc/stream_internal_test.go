package cdc

import (
	"slices"
	"testing"
)

// TestPluginArgsQuotePublication: the publication name reaches pgoutput
// as the one identifier CREATE PUBLICATION was given, whatever it holds:
// a literal of the replication grammar holding a double-quoted identifier.
func TestPluginArgsQuotePublication(t *testing.T) {
	for _, tt := range []struct{ name, want string }{
		{"tidemark_shop", `publication_names '"tidemark_shop"'`},
		{"it's", `publication_names '"it''s"'`},
		{`a'b", "c`, `publication_names '"a''b"", ""c"'`},
		{`Shop,x\`, `publication_names '"Shop,x\"'`},
	} {
		got := pluginArgs(tt.name)
		if want := []string{"proto_version '2'", tt.want, "streaming 'on'", "messages 'true'"}; !slices.Equal(got, want) {
			t.Errorf("pluginArgs(%q) = %q, want %q", tt.name, got, want)
		}
	}
}
