// Package pgserver starts a private, throwaway PostgreSQL server from the
// server binaries installed on the machine.
//
// Tests, the demo and the benchmarks use it so that nothing but the
// PostgreSQL binaries (initdb, postgres) has to be installed. The server
// listens on a random loopback port, runs with wal_level=logical so logical
// replication can be exercised, trusts local connections, and lives in a
// temporary directory that Stop removes. PostgreSQL refuses to run as root;
// when the caller is root the server runs as the unprivileged "postgres"
// user (or the user named by TIDEMARK_PG_USER).
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure a server. The zero value is a fast server for tests.
type Options struct {
	// Durable keeps fsync and synchronous_commit on, as a production
	// server would run. Benchmarks set it; tests leave it off for speed.
	Durable bool
	// Settings are extra postgresql.conf settings, applied last.
	Settings map[string]string
	// Log receives the server log; nil discards it.
	Log func(line string)
	// TLS, when set, turns on ssl with these files (copied into the data
	// directory, so the server's user can read them).
	TLS *TLSFiles
	// HBA replaces the default pg_hba.conf, which trusts every local and
	// loopback connection. Tests of authentication and least privilege
	// set it.
	HBA []string
}

// TLSFiles are the server's certificate, its key, and optionally the CA
// whose certificates clients may present (ssl_ca_file).
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Server is a running PostgreSQL server owned by this process.
type Server struct {
	Host string // loopback address
	Port int

	bin     string
	root    string // temp dir holding data and socket dirs
	dataDir string
	cred    *syscall.Credential
	opts    Options
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile string
}

// Start initialises a new cluster in a fresh temporary directory and starts
// it. The caller must call Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	// The data directory must be reachable by the server's user, so it
	// cannot live under a directory private to root. Keep the path short:
	// the unix socket path must stay under ~100 bytes.
	root, err := os.MkdirTemp("", "tidemark-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: temp dir: %w", err)
	}
	s := &Server{Host: "127.0.0.1", bin: bin, root: root, dataDir: filepath.Join(root, "data"), cred: cred, opts: opts,
		logFile: filepath.Join(root, "server.log")}
	if err := s.chown(root); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	if err := s.initdb(ctx); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	if err := s.writeConf(); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	if err := s.startOnFreePort(ctx); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	return s, nil
}

// startOnFreePort starts the server on a free port, trying another up to
// five times: a port found free can be taken before the server binds it.
func (s *Server) startOnFreePort(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		s.Port = port
		if lastErr = s.start(ctx); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

// FindBinDir locates the directory holding initdb and postgres:
// TIDEMARK_PG_BIN when set (make test PG=17 sets it), else initdb on PATH,
// else the newest /usr/lib/postgresql/*/bin.
func FindBinDir() (string, error) {
	if dir := os.Getenv("TIDEMARK_PG_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
			return "", fmt.Errorf("pgserver: TIDEMARK_PG_BIN=%s has no initdb: %w", dir, err)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	return "", errors.New("pgserver: no PostgreSQL server binaries found: put initdb on PATH, set TIDEMARK_PG_BIN, or install postgresql (Debian: apt-get install postgresql)")
}

// FindPSQL locates psql: next to the server binaries first, then on PATH.
// It comes with every PostgreSQL installation (Debian: postgresql-client).
func FindPSQL() (string, error) {
	if dir, err := FindBinDir(); err == nil {
		if p := filepath.Join(dir, "psql"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("psql")
	if err != nil {
		return "", fmt.Errorf("pgserver: psql not found next to the server binaries or on PATH (Debian: apt-get install postgresql-client): %w", err)
	}
	return p, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func versionOf(path string) int {
	// /usr/lib/postgresql/15/bin/initdb -> 15
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := os.Getenv("TIDEMARK_PG_USER")
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root and PostgreSQL refuses root; need an unprivileged user %q (create it or set TIDEMARK_PG_USER): %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
		return fmt.Errorf("pgserver: chown %s: %w", path, err)
	}
	return nil
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.root
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (s *Server) initdb(ctx context.Context) error {
	cmd := s.command(ctx, "initdb", "-D", s.dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-instructions", "--locale=C")
	if !s.opts.Durable {
		cmd.Args = append(cmd.Args, "--no-sync")
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgserver: initdb: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (s *Server) writeConf() error {
	settings := map[string]string{
		"listen_addresses":          "'127.0.0.1'",
		"unix_socket_directories":   "'" + s.root + "'",
		"wal_level":                 "logical",
		"max_wal_senders":           "20",
		"max_replication_slots":     "20",
		"max_connections":           "200",
		"shared_buffers":            "128MB",
		"timezone":                  "'UTC'",
		"log_timezone":              "'UTC'",
		"logging_collector":         "off",
		"log_min_messages":          "warning",
		"log_min_error_statement":   "panic",
		"max_locks_per_transaction": "256",
	}
	if !s.opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	if t := s.opts.TLS; t != nil {
		settings["ssl"] = "on"
		for key, src := range map[string]string{"ssl_cert_file": t.CertFile, "ssl_key_file": t.KeyFile, "ssl_ca_file": t.CAFile} {
			if src == "" {
				continue
			}
			dst := filepath.Join(s.dataDir, key+".pem")
			if err := s.copyPrivate(src, dst); err != nil {
				return err
			}
			settings[key] = "'" + dst + "'"
		}
	}
	for k, v := range s.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	// The harness itself always connects through the local socket.
	hba := "local all all trust\nlocal replication all trust\n"
	if len(s.opts.HBA) > 0 {
		hba += strings.Join(s.opts.HBA, "\n") + "\n"
	} else {
		hba += "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	}
	if err := appendFile(filepath.Join(s.dataDir, "postgresql.auto.conf"), conf.String()); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.dataDir, "pg_hba.conf"), []byte(hba), 0o600)
}

// copyPrivate copies src to dst, readable only by the server's user, as
// PostgreSQL demands of a key file.
func (s *Server) copyPrivate(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return s.chown(dst)
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if _, err := f.WriteString(text); err != nil {
		_ = f.Close()
		return fmt.Errorf("pgserver: write %s: %w", path, err)
	}
	return f.Close()
}

// start runs postgres in the foreground as a child of this process, so that
// the server dies with the process (Pdeathsig) even when it is killed.
func (s *Server) start(ctx context.Context) error {
	// Not tied to ctx: the server outlives the start call.
	cmd := s.command(context.Background(), "postgres", "-D", s.dataDir, "-p", strconv.Itoa(s.Port))
	logf, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: log file: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("pgserver: postgres exited during start: %s", s.LogTail())
		case <-ctx.Done():
			s.kill()
			return ctx.Err()
		default:
		}
		if s.ping(ctx) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("pgserver: postgres did not accept connections within 60s: %s", s.LogTail())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.SocketURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// LogTail returns the last 2,000 bytes of the server's log, for an error
// message that should say what the server said.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(s.logFile)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// URL returns a connection string for database db as the superuser.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s:%d/%s?sslmode=disable", s.Host, s.Port, db)
}

// SocketURL returns a connection string for database db as the superuser
// through the server's unix socket, which pg_hba.conf always trusts.
func (s *Server) SocketURL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, s.root, s.Port)
}

// Pid returns the process id of the running postmaster, or 0.
func (s *Server) Pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop shuts the server down (fast mode) and removes its directory.
func (s *Server) Stop() error {
	err := s.shutdown(syscall.SIGINT, 30*time.Second)
	if rmErr := os.RemoveAll(s.root); rmErr != nil && err == nil {
		err = fmt.Errorf("pgserver: remove %s: %w", s.root, rmErr)
	}
	return err
}

// Restart stops the server (fast shutdown, or an immediate crash-like stop
// when crash is true) and starts it again on the same port with the same
// data. Open connections are broken, as in a real restart.
func (s *Server) Restart(ctx context.Context, crash bool) error {
	if err := s.Halt(crash); err != nil {
		return err
	}
	return s.Resume(ctx)
}

// Halt stops the server but keeps its data, for tests of an unavailable
// warehouse; crash selects an immediate (crash-like) shutdown.
func (s *Server) Halt(crash bool) error {
	sig := syscall.SIGINT
	if crash {
		sig = syscall.SIGQUIT // immediate shutdown: crash recovery on start
	}
	return s.shutdown(sig, 30*time.Second)
}

// Resume starts a halted server again on the same port.
func (s *Server) Resume(ctx context.Context) error { return s.start(ctx) }

func (s *Server) shutdown(sig syscall.Signal, wait time.Duration) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
		return nil
	case <-time.After(wait):
		s.kill()
		return fmt.Errorf("pgserver: postgres did not stop within %s; killed", wait)
	}
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: pick port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// HasLibrary reports whether the server binaries found by FindBinDir come
// with the shared library name (such as "citus") installed beside them, so
// that shared_preload_libraries can name it.
func HasLibrary(name string) bool {
	dir, err := FindBinDir()
	if err != nil {
		return false
	}
	return fileExists(filepath.Join(filepath.Dir(dir), "lib", name+".so"))
}
