// Package connerr explains, in a few words, why a PostgreSQL server or
// the client's own TLS checks refused a connection: an untrusted or
// misnamed server certificate, a server that accepts only encrypted
// connections, or one that requires a client certificate. The error
// messages of the driver and the server say so in their own terms; the
// explanation adds which connection parameter to look at.
//
// It also shortens the driver's report of a failed connection to one
// line: the driver lists every attempt on a line of its own, and repeats
// an attempt that failed the same way (with sslmode=prefer it tries each
// address with TLS and then without), so that one refused port reads as
// the same dial error twice, each naming the address twice.
package connerr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

// Error is a connection error with its explanation in front of it.
type Error struct {
	// Reason says why the connection was refused and what to check;
	// empty when the cause is not one it recognises.
	Reason string
	// Err is the error of the driver.
	Err error
}

// Error returns the reason, if any, and the driver's error, whose report
// of a failed connection is shortened to one line (see summary).
func (e *Error) Error() string {
	msg := e.Err.Error()
	var ce *pgconn.ConnectError
	if errors.As(e.Err, &ce) {
		msg = strings.Replace(msg, ce.Error(), summary(ce), 1)
	}
	if e.Reason == "" {
		return msg
	}
	return e.Reason + ": " + msg
}

// Unwrap returns the driver's error.
func (e *Error) Unwrap() error { return e.Err }

// Explain returns err with a short explanation in front when it is a
// refused connection whose cause it recognises, and with the driver's
// report shortened to one line when it is a failed connection (see
// summary); it returns err unchanged otherwise (also when err is nil or
// already explained). The explanation names connection parameters, never
// their values, so it cannot echo a password.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var done *Error
	if errors.As(err, &done) {
		return err
	}
	if reason := reason(err); reason != "" || pgerr.ConnectFailure(err) {
		return &Error{Reason: reason, Err: err}
	}
	return err
}

// summary describes a failed connection in one line: "cannot connect to
// ADDRESS (HOST): WHY", where WHY is the system's reason for a failed
// dial ("connection refused") and the driver's text otherwise, or
// "cannot connect: WHY" when the driver had no address to try (the host
// name did not resolve). Attempts that failed alike are named once,
// addresses that failed alike share their reason, and different failures
// are separated by semicolons.
func summary(ce *pgconn.ConnectError) string {
	var attempts []error
	switch inner := ce.Unwrap().(type) {
	case interface{ Unwrap() []error }:
		attempts = inner.Unwrap()
	case nil:
		return ce.Error()
	default:
		attempts = []error{inner}
	}
	type failure struct {
		why   string
		where []string
	}
	var failures []*failure
	for _, a := range attempts {
		where, why := attempt(a)
		var f *failure
		for _, g := range failures {
			if g.why == why {
				f = g
			}
		}
		if f == nil {
			f = &failure{why: why}
			failures = append(failures, f)
		}
		if where != "" && !slices.Contains(f.where, where) {
			f.where = append(f.where, where)
		}
	}
	if len(failures) == 0 {
		return ce.Error()
	}
	lead := "cannot connect to "
	parts := make([]string, 0, len(failures))
	for _, f := range failures {
		if len(f.where) == 0 {
			lead = "cannot connect: "
			parts = append(parts, f.why)
			continue
		}
		parts = append(parts, strings.Join(f.where, ", ")+": "+f.why)
	}
	return lead + strings.Join(parts, "; ")
}

// attempt splits the driver's error of one connection attempt, "ADDRESS
// (HOST): WHAT: ERR", into where it went and why it failed. An error
// that names no address (the host name did not resolve) has no where.
func attempt(err error) (where, why string) {
	text := err.Error()
	inner := errors.Unwrap(err)
	if inner == nil || !strings.HasSuffix(text, ": "+inner.Error()) {
		return "", oneLine(text)
	}
	where, why = strings.TrimSuffix(text, ": "+inner.Error()), inner.Error()
	if strings.Contains(where, ": ") || !strings.Contains(where, " (") || !strings.HasSuffix(where, ")") {
		// Not an attempt's address: a message of another shape, such
		// as the lookups of a host name that did not resolve, one line
		// each.
		return "", where + ": " + oneLine(inner.Error())
	}
	var opErr *net.OpError
	if errors.As(inner, &opErr) && opErr.Op == "dial" && opErr.Err != nil {
		why = opErr.Err.Error()
		var sysErr *os.SyscallError
		if errors.As(opErr.Err, &sysErr) {
			why = sysErr.Err.Error()
		}
	}
	return where, why
}

func reason(err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		pgErr    *pgconn.PgError
		opErr    *net.OpError
	)
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is signed by an unknown authority (check sslrootcert)"
	case errors.As(err, &hostname):
		return fmt.Sprintf("the server's certificate is not valid for host %s, only for %s (check the host in the DSN against the certificate's host names)",
			hostname.Host, certNames(hostname.Certificate))
	case errors.As(err, &invalid):
		return "the server's certificate was refused (check its validity dates and usage)"
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// A TLS alert from the server: it refused the client certificate.
		return "the server refused the client certificate (check that sslcert is signed by a CA the server trusts and still valid)"
	case pgerr.InvalidAuthorization(err) && errors.As(err, &pgErr):
		switch msg := pgErr.Message; {
		case strings.HasPrefix(msg, "no pg_hba.conf entry") && strings.HasSuffix(msg, "no encryption"):
			return "the server accepts only encrypted connections from this client (set sslmode=verify-full and sslrootcert)"
		case strings.Contains(msg, "requires a valid client certificate"):
			return "the server requires a client certificate signed by a CA it trusts (set sslcert and sslkey)"
		case strings.HasPrefix(msg, "certificate authentication failed"), strings.HasPrefix(msg, "certificate validation"):
			return "the client certificate's common name is not the user (or not mapped to it in pg_ident.conf)"
		}
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return "the server does not offer TLS (turn ssl on there, or lower sslmode)"
	case sentCertificate(err) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		// With TLS 1.3 the server checks the client certificate after
		// the client's side of the handshake is done; its alert can be
		// lost to the closed connection.
		return "the server closed the connection after the TLS handshake, as it does when it refuses the client certificate " +
			"(check that sslcert is signed by a CA the server trusts and still valid)"
	}
	return ""
}

// sentCertificate reports whether err is from a connection attempt that
// offered a client certificate.
func sentCertificate(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) && ce.Config != nil && ce.Config.TLSConfig != nil && len(ce.Config.TLSConfig.Certificates) > 0
}

// certNames lists the host names and addresses a certificate is valid for.
func certNames(c *x509.Certificate) string {
	if c == nil {
		return "no host names"
	}
	var names []string
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return "no host names"
	}
	return strings.Join(names, ", ")
}

// oneLine joins the distinct lines of text with semicolons.
func oneLine(text string) string {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}
