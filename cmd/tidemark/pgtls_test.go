package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/testcert"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// tlsEnv is one PostgreSQL server with ssl on, whose pg_hba.conf accepts
// only TLS connections over TCP, holding a warehouse database and a source
// database with a polled table and a replicated one. The pools reach both
// through the local socket, as superuser, to set up and to look.
type tlsEnv struct {
	srv     *pgserver.Server
	ca      *testcert.CA
	wh, src *pgxpool.Pool
}

// The source's tables hold this many rows.
const tlsRows = 50

// startTLSEnv starts the server with these pg_hba.conf lines and a server
// certificate for localhost only, signed by a test CA.
func startTLSEnv(t *testing.T, hba ...string) *tlsEnv {
	t.Helper()
	ca := testcert.NewCA(t, "tidemark test CA")
	cert := ca.Server(t, "localhost")
	srv := pgtest.NewServer(t, pgserver.Options{
		TLS: &pgserver.TLSFiles{CertFile: cert.CertFile, KeyFile: cert.KeyFile, CAFile: ca.CAFile}, HBA: hba})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.SocketURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, db := range []string{"warehouse", "source"} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	e := &tlsEnv{srv: srv, ca: ca, wh: pgtest.Pool(t, srv.SocketURL("warehouse")), src: pgtest.Pool(t, srv.SocketURL("source"))}
	if _, err := e.src.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, email text NOT NULL, updated_at timestamptz NOT NULL);
		INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', now() - interval '1 hour' FROM generate_series(1, %[1]d) AS i;
		CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL);
		INSERT INTO orders SELECT i, i FROM generate_series(1, %[1]d) AS i`, tlsRows)); err != nil {
		t.Fatal(err)
	}
	return e
}

// dsn is a keyword/value connection string to database db by host, with
// the TLS parameters in params.
func (e *tlsEnv) dsn(db, host, params string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s %s", host, e.srv.Port, db, params)
}

// refusal is what a refused connection by host reports after its
// reason: the address and the driver's text.
func (e *tlsEnv) refusal(host, detail string) string {
	return fmt.Sprintf("cannot connect to 127.0.0.1:%d (%s): %s", e.srv.Port, host, detail)
}

// tlsConfig writes a configuration loading the poll source customers and
// the CDC source shop of the source database into the warehouse, with the
// HTTP server on listen (or "off") and the log as JSON.
func tlsConfig(t *testing.T, whDSN, pollDSN, cdcDSN, listen string) string {
	t.Helper()
	return writeFile(t, "tls.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: %q}
log: {format: json}
sources:
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_customers}
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms}
    mirror: {table: dw_orders}
`, whDSN, listen, pollDSN, cdcDSN))
}

// running is `tidemark run` in this process, its log in out.
type running struct {
	out    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan int
}

// startRunning starts `tidemark run` with args; the test's cleanup stops
// it, and fails the test unless it exits 0.
func startRunning(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{out: &syncbuf.Buffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() { r.done <- run(ctx, append([]string{"run"}, args...), r.out, r.out) }()
	t.Cleanup(func() {
		r.cancel()
		if code := <-r.done; code != exitOK {
			t.Errorf("tidemark run exited %d:\n%s", code, r.out)
		} else if t.Failed() {
			t.Logf("tidemark run log:\n%s", r.out)
		}
	})
	return r
}

// logged waits for a log record with message msg and returns its err.
func (r *running) logged(t *testing.T, msg string) string {
	t.Helper()
	var got string
	waitfor.Until(t, "the log message "+msg, func() bool {
		for _, line := range strings.Split(r.out.String(), "\n") {
			var rec struct{ Msg, Err string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
				got = rec.Err
				return true
			}
		}
		return false
	})
	return got
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// readyz fetches /readyz from addr: its status code and checks.
func readyz(addr string) (int, map[string]string, error) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	checks := map[string]string{}
	err = json.NewDecoder(resp.Body).Decode(&checks)
	return resp.StatusCode, checks, err
}

// normalise drops, from a connection error, the attempts at the other
// addresses localhost may resolve to (::1 where the hosts file lists it;
// the server listens on 127.0.0.1 only), and replaces the client's port
// by PORT, so that the messages compared are the same on every machine.
func normalise(msg string) string {
	msg = regexp.MustCompile(`\[::1\]:\d+ \(localhost\): [^;]*; |; \[::1\]:\d+ \(localhost\): [^;]*`).ReplaceAllString(msg, "")
	return regexp.MustCompile(`127\.0\.0\.1:\d+->`).ReplaceAllString(msg, "127.0.0.1:PORT->")
}

// sslBackends lists, for every backend connected over TCP, whether its
// connection is encrypted, its client certificate's subject, and what it
// is: "tidemark-cdc (walsender, streaming)" for the replication
// connection.
func sslBackends(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return pgtest.Lines(t, pool, `
		SELECT a.application_name || ' (' || a.backend_type || coalesce(', ' || r.state, '') || ')',
		       s.ssl, coalesce(s.client_dn, '-'), coalesce(a.datname, '-')
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) LEFT JOIN pg_stat_replication r USING (pid)
		WHERE a.client_addr IS NOT NULL
		ORDER BY 1, 4`)
}

// loadOverTLS migrates the warehouse, runs the poll and CDC sources until
// the source's rows are in the mirrors and raw tables and a change has
// streamed through the slot, and checks /readyz. It returns the TCP
// backends seen meanwhile (sslBackends), the walsender among them.
func (e *tlsEnv) loadOverTLS(t *testing.T, whDSN, pollDSN, cdcDSN string) []string {
	t.Helper()
	ctx := context.Background()
	addr := freeAddr(t)
	cfg := tlsConfig(t, whDSN, pollDSN, cdcDSN, addr)
	if code, out, errOut := invoke(t, "migrate", "-c", cfg); code != exitOK || !strings.Contains(out, "warehouse schema at version") {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	r := startRunning(t, "-c", cfg)
	count := func(table string) string {
		var n string
		if err := e.wh.QueryRow(ctx, "SELECT count(*)::text FROM "+table).Scan(&n); err != nil {
			return err.Error()
		}
		return n
	}
	counts := func() string {
		var b strings.Builder
		for _, table := range []string{"dw_customers", "raw.customers", "dw_orders", "raw.shop"} {
			fmt.Fprintf(&b, "%s %s; ", table, count(table))
		}
		fmt.Fprintf(&b, "dw_orders changed %s; ", count("dw_orders WHERE amount = 0"))
		return b.String()
	}
	wait := func(want string) {
		t.Helper()
		var got string
		if err := waitfor.Poll(waitfor.Timeout, func() bool { got = counts(); return got == want }); err != nil {
			t.Fatalf("rows loaded: %s\nwant %s", got, want)
		}
	}
	// The snapshot fills the CDC mirror only; changes streamed after it
	// are also kept in raw.shop.
	wait(fmt.Sprintf("dw_customers %[1]d; raw.customers %[1]d; dw_orders %[1]d; raw.shop 0; dw_orders changed 0; ", tlsRows))
	if _, err := e.src.Exec(ctx, "UPDATE orders SET amount = 0 WHERE id <= 5"); err != nil {
		t.Fatal(err)
	}
	wait(fmt.Sprintf("dw_customers %[1]d; raw.customers %[1]d; dw_orders %[1]d; raw.shop 5; dw_orders changed 5; ", tlsRows))
	backends := sslBackends(t, e.wh)
	code, checks, err := readyz(addr)
	if err != nil || code != http.StatusOK || checks["warehouse"] != "ok" {
		t.Errorf("/readyz: %d %v %v, want 200 and warehouse ok\n%s", code, checks, err, r.out)
	}
	return backends
}

// checkBackends checks that the TCP backends are the ones tidemark opened,
// every one of them encrypted, with the client certificate dn when one is
// expected, and that they include the walsender streaming from the slot.
func checkBackends(t *testing.T, backends []string, dn string) {
	t.Helper()
	walsender := false
	for _, b := range backends {
		cells := strings.Split(b, " | ")
		if !strings.HasPrefix(cells[0], "tidemark") || cells[1] != "true" || cells[2] != dn {
			t.Errorf("backend %q: want a tidemark connection with ssl true and client certificate %s", b, dn)
		}
		if strings.HasPrefix(b, "tidemark-cdc (walsender, streaming) | true | "+dn+" | source") {
			walsender = true
		}
	}
	if !walsender {
		t.Errorf("no encrypted walsender streaming to tidemark-cdc among the TCP backends:\n%s", strings.Join(backends, "\n"))
	}
	t.Logf("TCP backends (application (type, replication state) | ssl | client certificate | database):\n%s", strings.Join(backends, "\n"))
}

// tlsFault is one wrong TLS setting: the DSN parameters (and host) a
// connection uses, the explanation tidemark gives, and the driver's text
// after it ("DB" standing for the database, "SERVER" for the server's
// port); or, where the outcome is a race, one of the pairs in or.
type tlsFault struct {
	name, host, params, reason, detail string
	or                                 [][2]string
}

// explained lists the messages the fault may give for database db.
func (e *tlsEnv) explained(f tlsFault, db string) []string {
	var out []string
	for _, rd := range append([][2]string{{f.reason, f.detail}}, f.or...) {
		detail := strings.NewReplacer("DB", db, "SERVER", fmt.Sprint(e.srv.Port)).Replace(rd[1])
		out = append(out, rd[0]+": "+e.refusal(f.host, detail))
	}
	return out
}

// refusedAs fails the test unless msg, normalised, is prefix, one of the
// messages, and suffix.
func refusedAs(t *testing.T, what, msg, prefix string, messages []string, suffix string) {
	t.Helper()
	got := normalise(msg)
	for _, m := range messages {
		if got == prefix+m+suffix {
			return
		}
	}
	t.Errorf("%s:\n%s\nwant\n%s", what, got, prefix+strings.Join(messages, suffix+"\nor\n"+prefix)+suffix)
}

// refusedEverywhere checks that a fault refuses each connection with the
// explanation, naming the configuration key: the warehouse through
// `tidemark migrate`, `tidemark run`'s log and /readyz, the poll source
// through `tidemark poll --once`, the CDC source through `tidemark run`'s
// log. good are the DSN parameters of the connections left working.
func (e *tlsEnv) refusedEverywhere(t *testing.T, f tlsFault, good string) {
	t.Helper()
	bad := func(db string) string { return e.dsn(db, f.host, f.params) }
	goodWH, goodSrc := e.dsn("warehouse", "localhost", good), e.dsn("source", "localhost", good)

	t.Run("warehouse", func(t *testing.T) {
		cfg := tlsConfig(t, bad("warehouse"), goodSrc, goodSrc, "off")
		code, _, stderr := invoke(t, "migrate", "-c", cfg)
		if code != exitFailure {
			t.Errorf("migrate: exit %d, want 1", code)
		}
		refusedAs(t, "migrate's stderr", stderr, "tidemark migrate: warehouse.dsn: ", e.explained(f, "warehouse"), "\n")
		// `run` waits for the warehouse, saying why in its log and in
		// /readyz.
		addr := freeAddr(t)
		r := startRunning(t, "-c", tlsConfig(t, bad("warehouse"), goodSrc, goodSrc, addr))
		refusedAs(t, "run's log", r.logged(t, "warehouse unreachable; waiting for it"), "warehouse.dsn: ", e.explained(f, "warehouse"), "")
		code, checks, err := readyz(addr)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("/readyz: %d %v, want 503", code, err)
		}
		refusedAs(t, "/readyz warehouse", checks["warehouse"], "warehouse.dsn: ", e.explained(f, "warehouse"), "")
	})
	t.Run("poll", func(t *testing.T) {
		cfg := tlsConfig(t, goodWH, bad("source"), goodSrc, "off")
		code, _, stderr := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers")
		if code != exitFailure {
			t.Errorf("poll --once: exit %d, want 1", code)
		}
		// The command's error is its last line; warnings logged before it
		// may precede it.
		lines := strings.Split(strings.TrimSuffix(normalise(stderr), "\n"), "\n")
		refusedAs(t, "poll's error", lines[len(lines)-1], "tidemark poll: poll customers: sources.customers.poll.dsn: connect to source: ", e.explained(f, "source"), "")
	})
	t.Run("cdc", func(t *testing.T) {
		r := startRunning(t, "--only", "cdc", "-c", tlsConfig(t, goodWH, goodSrc, bad("source"), "off"))
		refusedAs(t, "run's log", r.logged(t, "cdc reader stopped; restarting"), "sources.shop.cdc.dsn: connect to source: ", e.explained(f, "source"), "")
	})
}

// TestPGTLSVerifyFull: against a server that accepts only TLS, the
// warehouse, a poll source and a CDC source (its replication connection
// included) connect with sslmode=verify-full and load; a CA that did not
// sign the server's certificate, a host name the certificate does not
// name, and plaintext are each refused on each connection, with the key
// to fix and the reason.
func TestPGTLSVerifyFull(t *testing.T) {
	e := startTLSEnv(t, "hostssl all all 127.0.0.1/32 trust", "hostssl replication all 127.0.0.1/32 trust")
	verify := "sslmode=verify-full sslrootcert=" + e.ca.CAFile

	t.Run("loads", func(t *testing.T) {
		// The warehouse as a URL, the sources as keyword/value pairs.
		whURL := fmt.Sprintf("postgres://postgres@localhost:%d/warehouse?sslmode=verify-full&sslrootcert=%s", e.srv.Port, e.ca.CAFile)
		checkBackends(t, e.loadOverTLS(t, whURL, e.dsn("source", "localhost", verify), e.dsn("source", "localhost", verify)), "-")
	})

	other := testcert.NewCA(t, "another CA")
	for _, f := range []tlsFault{
		{name: "CA that did not sign the server certificate", host: "localhost", params: "sslmode=verify-full sslrootcert=" + other.CAFile,
			reason: "the server's certificate is signed by an unknown authority (check sslrootcert)",
			detail: "failed to write startup message: write failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{name: "host name not in the certificate", host: "127.0.0.1", params: verify,
			reason: "the server's certificate is not valid for host 127.0.0.1, only for localhost (check the host in the DSN against the certificate's host names)",
			detail: "failed to write startup message: write failed: tls: failed to verify certificate: x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"},
		{name: "plaintext", host: "127.0.0.1", params: "sslmode=disable",
			reason: "the server accepts only encrypted connections from this client (set sslmode=verify-full and sslrootcert)",
			detail: `server error: FATAL: no pg_hba.conf entry for host "127.0.0.1", user "postgres", database "DB", no encryption (SQLSTATE 28000)`},
	} {
		t.Run(f.name, func(t *testing.T) { e.refusedEverywhere(t, f, verify) })
	}

	// sslrootcert=system: the CAs of the system, which Go reads from
	// SSL_CERT_FILE when it is set; verify-full is implied.
	for _, tt := range []struct {
		name, caFile string
		code         int
		want         string
	}{
		{"system CAs include the server's", e.ca.CAFile, exitOK, "warehouse schema at version"},
		{"system CAs lack the server's", other.CAFile, exitFailure, "tidemark migrate: warehouse.dsn: the server's certificate is signed by an unknown authority (check sslrootcert)"},
	} {
		t.Run("sslrootcert=system/"+tt.name, func(t *testing.T) {
			cfg := tlsConfig(t, e.dsn("warehouse", "localhost", "sslmode=require sslrootcert=system"), e.dsn("source", "localhost", verify), e.dsn("source", "localhost", verify), "off")
			p := startWith(t, []string{"SSL_CERT_FILE=" + tt.caFile, "SSL_CERT_DIR=" + t.TempDir()}, "migrate", "-c", cfg)
			<-p.exited
			if code := p.cmd.ProcessState.ExitCode(); code != tt.code || !strings.Contains(p.output.String(), tt.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, tt.code, tt.want, p.output)
			}
		})
	}
}

// TestPGTLSClientCert: against a server that authenticates by client
// certificate only (pg_hba.conf cert), the warehouse, a poll source and a
// CDC source with sslcert and sslkey connect, replication included, and
// load; without a client certificate, with one of another CA, or with one
// of a CA that only has the same name, each connection is refused with the
// key to fix and the reason.
func TestPGTLSClientCert(t *testing.T) {
	e := startTLSEnv(t, "hostssl all all 127.0.0.1/32 cert", "hostssl replication all 127.0.0.1/32 cert")
	verify := "sslmode=verify-full sslrootcert=" + e.ca.CAFile
	withCert := func(p *testcert.Pair) string {
		return verify + " sslcert=" + p.CertFile + " sslkey=" + p.KeyFile
	}
	good := withCert(e.ca.Client(t, "postgres"))

	t.Run("loads", func(t *testing.T) {
		src := e.dsn("source", "localhost", good)
		checkBackends(t, e.loadOverTLS(t, e.dsn("warehouse", "localhost", good), src, src), "/CN=postgres")
	})

	// Go's TLS client sends a certificate only when its issuer is among
	// the CAs the server names; one of another CA is therefore not sent at
	// all, and the server says a certificate is required. One whose CA
	// merely has the same name is sent, and the server's TLS refuses it.
	required := "the server requires a client certificate signed by a CA it trusts (set sslcert and sslkey)"
	requiredDetail := "server error: FATAL: connection requires a valid client certificate (SQLSTATE 28000)"
	resetReason := "the server closed the connection after the TLS handshake, as it does when it refuses the client certificate " +
		"(check that sslcert is signed by a CA the server trusts and still valid)"
	for _, f := range []tlsFault{
		{name: "no client certificate", host: "localhost", params: verify, reason: required, detail: requiredDetail},
		{name: "client certificate of another CA", host: "localhost", params: withCert(testcert.NewCA(t, "another CA").Client(t, "postgres")),
			reason: required, detail: requiredDetail},
		{name: "client certificate of a CA with the same name", host: "localhost", params: withCert(testcert.NewCA(t, "tidemark test CA").Client(t, "postgres")),
			reason: "the server refused the client certificate (check that sslcert is signed by a CA the server trusts and still valid)",
			detail: "failed to receive message: remote error: tls: unknown certificate authority",
			// With TLS 1.3 the server checks the certificate after the
			// client's handshake is done; its alert may be lost to the
			// connection it closes.
			or: [][2]string{
				{resetReason, "failed to write startup message: write failed: write tcp 127.0.0.1:PORT->127.0.0.1:SERVER: write: connection reset by peer"},
				{resetReason, "failed to receive message: read tcp 127.0.0.1:PORT->127.0.0.1:SERVER: read: connection reset by peer"},
				{resetReason, "failed to receive message: unexpected EOF"},
			}},
	} {
		t.Run(f.name, func(t *testing.T) { e.refusedEverywhere(t, f, good) })
	}
}

// TestPGTLSNormalise: the messages compared above are the same whether
// localhost resolves to 127.0.0.1 only or to ::1 as well.
func TestPGTLSNormalise(t *testing.T) {
	const one = "x: cannot connect to 127.0.0.1:5432 (localhost): tls error"
	for _, tt := range []struct{ name, msg string }{
		{"127.0.0.1 only", one},
		{"::1 first", "x: cannot connect to [::1]:5432 (localhost): connection refused; 127.0.0.1:5432 (localhost): tls error"},
		{"::1 last", "x: cannot connect to 127.0.0.1:5432 (localhost): tls error; [::1]:5432 (localhost): cannot assign requested address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := normalise(tt.msg); got != one {
				t.Errorf("normalise:\n%s\nwant\n%s", got, one)
			}
		})
	}
}
