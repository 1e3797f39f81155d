package connerr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestExplain covers what needs no server: errors it leaves alone and an
// explanation added once. The refusals themselves are tested against a
// real server in cmd/tidemark (TestPGTLS...).
func TestExplain(t *testing.T) {
	noTLS := fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "28000",
		Message: `no pg_hba.conf entry for host "127.0.0.1", user "u", database "d", no encryption`})
	other := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"not recognised", other, other.Error()},
		{"no encryption", noTLS, "the server accepts only encrypted connections from this client (set sslmode=verify-full and sslrootcert): " + noTLS.Error()},
		{"explained once", fmt.Errorf("again: %w", Explain(noTLS)),
			"again: the server accepts only encrypted connections from this client (set sslmode=verify-full and sslrootcert): " + noTLS.Error()},
		{"other password refusal", &pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "u"`},
			`: password authentication failed for user "u" (SQLSTATE 28P01)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Explain(tt.err)
			if tt.err == nil {
				if got != nil {
					t.Fatalf("Explain(nil) = %v", got)
				}
				return
			}
			if got.Error() != tt.want {
				t.Errorf("got  %q\nwant %q", got.Error(), tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("%v does not wrap %v", got, tt.err)
			}
		})
	}
}
