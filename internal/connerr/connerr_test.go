package connerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestExplain covers what needs no server: errors it leaves alone and an
// explanation added once. The refusals themselves are tested against a
// real server in cmd/tidemark (TestPGTLS...).
func TestExplain(t *testing.T) {
	noTLS := fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: pgerrcode.InvalidAuthorizationSpecification,
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
		{"other password refusal", &pgconn.PgError{Code: pgerrcode.InvalidPassword, Message: `password authentication failed for user "u"`},
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

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// hangUp returns the port of a loopback listener that closes every
// connection it accepts at once.
func hangUp(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestExplainConnect: a failed connection reads as one line naming each
// address once with why it failed, however many attempts the driver
// made; the driver's error stays reachable.
func TestExplainConnect(t *testing.T) {
	closed, other, hung := closedPort(t), closedPort(t), hangUp(t)
	tests := []struct {
		name, dsn string
		want      *regexp.Regexp
	}{
		// sslmode=prefer (the default) tries with TLS, then without:
		// the driver reports the same refusal twice.
		{"refused twice", fmt.Sprintf("postgres://u@127.0.0.1:%d/db", closed),
			regexp.MustCompile(fmt.Sprintf(`^cannot connect to 127\.0\.0\.1:%d \(127\.0\.0\.1\): connection refused$`, closed))},
		{"two addresses refused alike", fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=u dbname=db sslmode=disable", closed, other),
			regexp.MustCompile(fmt.Sprintf(`^cannot connect to 127\.0\.0\.1:%d \(127\.0\.0\.1\), 127\.0\.0\.1:%d \(127\.0\.0\.1\): connection refused$`, closed, other))},
		{"two addresses refused differently", fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=u dbname=db sslmode=disable", closed, hung),
			regexp.MustCompile(fmt.Sprintf(`^cannot connect to 127\.0\.0\.1:%d \(127\.0\.0\.1\): connection refused; 127\.0\.0\.1:%d \(127\.0\.0\.1\): [^;\n]+$`, closed, hung))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgconn.Connect(ctx, tt.dsn)
			if err == nil {
				_ = conn.Close(ctx)
				t.Fatal("connected")
			}
			got := Explain(fmt.Errorf("warehouse.dsn: %w", err))
			if want := "warehouse.dsn: "; !strings.HasPrefix(got.Error(), want) || !tt.want.MatchString(strings.TrimPrefix(got.Error(), want)) {
				t.Errorf("got  %q\nwant warehouse.dsn: and %s\nthe driver said %q", got, tt.want, err)
			}
			var ce *pgconn.ConnectError
			if !errors.As(got, &ce) || !errors.Is(got, err) {
				t.Errorf("%v does not wrap the driver's %T", got, err)
			}
			if again := Explain(got); again != got {
				t.Errorf("explained twice: %q", again)
			}
		})
	}
}
