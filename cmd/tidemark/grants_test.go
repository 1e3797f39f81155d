package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/internal/syncbuf"
)

// TestPreflightVerdict: `tidemark run` stops for missing privileges, but
// not for a check cut short by a lost connection (found by TestChaos: a
// PostgreSQL restart during the check made run exit with status 1).
func TestPreflightVerdict(t *testing.T) {
	missing := &grants.MissingError{Problems: []string{"sources.x.poll: role r lacks SELECT on t"}}
	lost := fmt.Errorf("check privileges: SELECT of role r: %w", io.ErrUnexpectedEOF)
	tests := []struct {
		name string
		err  error
		want error
		warn bool
	}{
		{"passed", nil, nil, false},
		{"missing privileges", missing, missing, false},
		{"missing privileges, wrapped", fmt.Errorf("sources.x: %w", missing), missing, false},
		{"connection lost during the check", lost, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out syncbuf.Buffer
			got := preflightVerdict(tt.err, slog.New(slog.NewTextHandler(&out, nil)))
			if (got == nil) != (tt.want == nil) || (tt.want != nil && !errors.Is(got, tt.want)) {
				t.Errorf("preflightVerdict(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if warned := strings.Contains(out.String(), "cannot check privileges now"); warned != tt.warn {
				t.Errorf("warned = %v, want %v; log: %s", warned, tt.warn, out.String())
			}
		})
	}
}
