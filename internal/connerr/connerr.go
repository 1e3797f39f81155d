// Package connerr explains, in a few words, why a PostgreSQL server or
// the client's own TLS checks refused a connection: an untrusted or
// misnamed server certificate, a server that accepts only encrypted
// connections, or one that requires a client certificate. The error
// messages of the driver and the server say so in their own terms; the
// explanation adds which connection parameter to look at.
package connerr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is a connection error with its explanation in front of it.
type Error struct {
	// Reason says why the connection was refused and what to check.
	Reason string
	// Err is the error of the driver.
	Err error
}

func (e *Error) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the driver's error.
func (e *Error) Unwrap() error { return e.Err }

// Explain returns err with a short explanation in front when it is a
// refused connection whose cause it recognises, and err unchanged
// otherwise (also when err is nil or already explained). The explanation
// names connection parameters, never their values, so it cannot echo a
// password.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var done *Error
	if errors.As(err, &done) {
		return err
	}
	if reason := reason(err); reason != "" {
		return &Error{Reason: reason, Err: err}
	}
	return err
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
	case errors.As(err, &pgErr) && pgErr.Code == "28000":
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
