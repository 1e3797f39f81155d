package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// SQL of making a standby and of failing over, by server version where
// it differs (PostgreSQL 15 renamed the backup functions).
const (
	serverVersionSQL = `SELECT current_setting('server_version_num')::int`
	// createPhysicalSlotSQL reserves WAL at once, so that nothing the
	// standby needs is removed before it connects.
	createPhysicalSlotSQL = `SELECT pg_create_physical_replication_slot($1, true)`
	backupStartSQL        = `SELECT pg_backup_start($1, true)`
	backupStopSQL         = `SELECT labelfile, spcmapfile FROM pg_backup_stop(false)`
	backupStartSQL14      = `SELECT pg_start_backup($1, true, false)`
	backupStopSQL14       = `SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)`
	// streamingSQL is the state of the standby named $1 as its primary
	// sees it: streaming, and its sync_state.
	streamingSQL = `
SELECT state = 'streaming', sync_state FROM pg_stat_replication WHERE application_name = $1`
	currentLSNSQL  = `SELECT pg_current_wal_insert_lsn()::text`
	replayedSQL    = `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`
	promoteSQL     = `SELECT pg_promote(true, $1)`
	inRecoverySQL  = `SELECT pg_is_in_recovery()`
	reloadConfSQL  = `SELECT pg_reload_conf()`
	alterSystemSQL = `ALTER SYSTEM SET %s = %s`
)

// pollEvery is the pause between two looks at a server's state while
// waiting for it to change (a standby to stream, to replay).
const pollEvery = 20 * time.Millisecond

// DefaultStandbyName is the name of a standby whose options give none.
const DefaultStandbyName = "standby1"

// StandbyOptions configure a hot standby made by StartStandby.
type StandbyOptions struct {
	// Name is the standby's physical replication slot on the primary
	// and its application_name, by which synchronous_standby_names and
	// synchronized_standby_slots name it. Default DefaultStandbyName.
	Name string
	// PrimaryAddr, "host:port", is where the standby reaches the primary
	// over TCP (a proxy in between, to cut or stall replication); by
	// default it connects through the primary's unix socket.
	PrimaryAddr string
	// Synchronous makes the primary wait for the standby at every
	// commit: synchronous_standby_names names it and synchronous_commit
	// is on (the test servers turn it off otherwise). StartStandby
	// returns once the primary reports the standby as synchronous.
	Synchronous bool
	// Settings are extra postgresql.conf settings of the standby, in the
	// syntax of Options.Settings, applied last: sync_replication_slots,
	// a wal_level of its own, and so on. The standby otherwise has the
	// primary's settings, except those that would make it wait for
	// standbys of its own once promoted (synchronous_standby_names and,
	// from 17 on, synchronized_standby_slots are cleared).
	Settings map[string]string
}

// StartStandby makes a hot standby of the running server s and starts
// it: a physical replication slot on s named after the standby, a base
// backup taken with the backup functions and a copy of the data
// directory (the server binaries of some versions come without
// pg_basebackup), and streaming replication through the slot with
// hot_standby_feedback on. It returns once s reports the standby
// streaming (and synchronous, with opts.Synchronous), or when ctx ends.
// The caller must Stop the standby.
func (s *Server) StartStandby(ctx context.Context, opts StandbyOptions) (*Server, error) {
	name := opts.Name
	if name == "" {
		name = DefaultStandbyName
	}
	root, err := os.MkdirTemp("", "tidemark-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: temp dir: %w", err)
	}
	sb := &Server{Host: s.Host, bin: s.bin, root: root, dataDir: filepath.Join(root, "data"), cred: s.cred, opts: s.opts,
		logFile: filepath.Join(root, "server.log")}
	if err := sb.makeStandby(ctx, s, name, opts); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	if err := sb.startOnFreePort(ctx); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	if err := s.waitStandby(ctx, name, false); err != nil {
		_ = sb.Stop()
		return nil, err
	}
	if opts.Synchronous {
		err := s.Configure(ctx, map[string]string{
			"synchronous_standby_names": quoteConf(pgquote.Ident(name)),
			"synchronous_commit":        "on",
		})
		if err == nil {
			err = s.waitStandby(ctx, name, true)
		}
		if err != nil {
			_ = sb.Stop()
			return nil, err
		}
	}
	return sb, nil
}

// makeStandby fills sb's data directory with a base backup of primary and
// the settings of a standby named name streaming from it.
func (sb *Server) makeStandby(ctx context.Context, primary *Server, name string, opts StandbyOptions) error {
	if err := sb.chown(sb.root); err != nil {
		return err
	}
	// One session for the whole backup: a non-exclusive backup ends
	// with the session that started it.
	conn, err := pgx.Connect(ctx, primary.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version int
	if err := conn.QueryRow(ctx, serverVersionSQL).Scan(&version); err != nil {
		return fmt.Errorf("pgserver: server version: %w", err)
	}
	if _, err := conn.Exec(ctx, createPhysicalSlotSQL, name); err != nil {
		return fmt.Errorf("pgserver: create the standby's slot %s: %w", name, err)
	}
	start, stop := backupStartSQL, backupStopSQL
	if version < 150000 {
		start, stop = backupStartSQL14, backupStopSQL14
	}
	if _, err := conn.Exec(ctx, start, "tidemark standby "+name); err != nil {
		return fmt.Errorf("pgserver: start the base backup: %w", err)
	}
	copyErr := sb.copyData(primary.dataDir)
	var label, spcmap *string
	// The backup is stopped even when the copy failed, or the session's
	// end aborts it with a warning.
	if err := conn.QueryRow(ctx, stop).Scan(&label, &spcmap); err != nil {
		return errors.Join(copyErr, fmt.Errorf("pgserver: stop the base backup: %w", err))
	}
	if copyErr != nil {
		return copyErr
	}
	if label == nil {
		return errors.New("pgserver: the base backup returned no backup label")
	}
	if err := sb.writeOwned("backup_label", *label); err != nil {
		return err
	}
	if spcmap != nil && *spcmap != "" {
		if err := sb.writeOwned("tablespace_map", *spcmap); err != nil {
			return err
		}
	}
	if err := sb.writeOwned("standby.signal", ""); err != nil {
		return err
	}
	host, port := primary.root, strconv.Itoa(primary.Port)
	if opts.PrimaryAddr != "" {
		if host, port, err = net.SplitHostPort(opts.PrimaryAddr); err != nil {
			return fmt.Errorf("pgserver: standby options: PrimaryAddr: %w", err)
		}
	}
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres application_name=%s", host, port, name)
	settings := map[string]string{
		"unix_socket_directories":   quoteConf(sb.root),
		"primary_conninfo":          quoteConf(conninfo),
		"primary_slot_name":         quoteConf(name),
		"hot_standby":               "on",
		"hot_standby_feedback":      "on",
		"synchronous_standby_names": "''",
	}
	if version >= 170000 {
		settings["synchronized_standby_slots"] = "''"
	}
	maps.Copy(settings, opts.Settings)
	return appendFile(filepath.Join(sb.dataDir, "postgresql.auto.conf"), confText(settings))
}

// skipInBackup are the entries of a data directory a base backup leaves
// out (their contents, for directories): the WAL, which the standby
// streams; the primary's slots; and the files of the running postmaster.
var skipInBackup = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "postmaster.pid": true, "postmaster.opts": true,
	"pg_stat_tmp": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true,
	"standby.signal": true, "recovery.signal": true, "backup_label": true, "tablespace_map": true,
}

// copyData copies the data directory src of a server in backup mode into
// sb's: files may change or go while they are copied, which WAL replay
// from the backup's start repairs. Directories left out keep their place,
// empty, as PostgreSQL expects.
func (sb *Server) copyData(src string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("pgserver: copy %s: %w", path, err)
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(sb.dataDir, rel)
		// Relation cache files are rebuilt at start.
		skip := rel != "." && (skipInBackup[rel] || d.Name() == "pg_internal.init")
		switch {
		case d.IsDir():
			if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("pgserver: %w", err)
			}
			if err := sb.chown(dst); err != nil {
				return err
			}
			if rel == "pg_wal" {
				archive := filepath.Join(dst, "archive_status")
				if err := os.Mkdir(archive, 0o700); err != nil {
					return fmt.Errorf("pgserver: %w", err)
				}
				if err := sb.chown(archive); err != nil {
					return err
				}
			}
			if skip {
				return fs.SkipDir
			}
			return nil
		case skip || !d.Type().IsRegular():
			return nil
		}
		return sb.copyFile(path, dst)
	})
}

// copyFile copies one file into sb's data directory, owned by the
// server's user; a file gone meanwhile is no error.
func (sb *Server) copyFile(src, dst string) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("pgserver: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return sb.chown(dst)
}

// writeOwned writes a file of sb's data directory, owned by the server's
// user.
func (sb *Server) writeOwned(name, text string) error {
	path := filepath.Join(sb.dataDir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return sb.chown(path)
}

// waitStandby waits until s reports the standby name streaming, and
// synchronous when sync is set.
func (s *Server) waitStandby(ctx context.Context, name string, sync bool) error {
	what := "streaming"
	if sync {
		what = "synchronous"
	}
	return s.poll(ctx, fmt.Sprintf("standby %s to be %s", name, what), func(conn *pgx.Conn) (bool, error) {
		var streaming bool
		var state string
		err := conn.QueryRow(ctx, streamingSQL, name).Scan(&streaming, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil && streaming && (!sync || state == "sync"), err
	})
}

// poll checks cond on a connection to s every pollEvery until it holds,
// and fails, naming what, when ctx ends first.
func (s *Server) poll(ctx context.Context, what string, cond func(*pgx.Conn) (bool, error)) error {
	conn, err := pgx.Connect(ctx, s.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: waiting for %s: %w", what, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var last error
	for {
		ok, err := cond(conn)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(pollEvery):
		}
	}
}

// Configure changes settings of the running server s (ALTER SYSTEM, in
// the syntax of Options.Settings) and reloads its configuration: for
// settings a test changes on a running primary, such as
// synchronized_standby_slots. Settings that need a restart take effect
// at the next one.
func (s *Server) Configure(ctx context.Context, settings map[string]string) error {
	conn, err := pgx.Connect(ctx, s.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: configure: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// ALTER SYSTEM runs outside a transaction block: one a statement.
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		if _, err := conn.Exec(ctx, fmt.Sprintf(alterSystemSQL, pgquote.Ident(k), settings[k])); err != nil {
			return fmt.Errorf("pgserver: set %s = %s: %w", k, settings[k], err)
		}
	}
	if _, err := conn.Exec(ctx, reloadConfSQL); err != nil {
		return fmt.Errorf("pgserver: reload the configuration: %w", err)
	}
	return nil
}

// CurrentLSN returns the end of the WAL s, a primary, has inserted: a
// standby that has replayed up to it has every commit made so far, also
// those of sessions with synchronous_commit off, whose WAL the primary
// writes and sends a moment later.
func (s *Server) CurrentLSN(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.SocketURL("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgserver: current WAL position: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var lsn string
	if err := conn.QueryRow(ctx, currentLSNSQL).Scan(&lsn); err != nil {
		return "", fmt.Errorf("pgserver: current WAL position: %w", err)
	}
	return lsn, nil
}

// WaitReplayed waits until s, a standby, has replayed the WAL up to lsn
// (as CurrentLSN gives it), or ctx ends.
func (s *Server) WaitReplayed(ctx context.Context, lsn string) error {
	return s.poll(ctx, "the standby to replay "+lsn, func(conn *pgx.Conn) (bool, error) {
		var done bool
		err := conn.QueryRow(ctx, replayedSQL, lsn).Scan(&done)
		return done, err
	})
}

// Promote promotes s, a standby, to a primary, and returns once it
// accepts writes, or when ctx ends.
func (s *Server) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	wait := 60
	if deadline, ok := ctx.Deadline(); ok {
		wait = max(1, int(time.Until(deadline).Seconds()))
	}
	var promoted bool
	if err := conn.QueryRow(ctx, promoteSQL, wait).Scan(&promoted); err != nil {
		return fmt.Errorf("pgserver: promote: %w", err)
	}
	if !promoted {
		return fmt.Errorf("pgserver: the standby was not promoted within %ds: %s", wait, s.LogTail())
	}
	var inRecovery bool
	if err := conn.QueryRow(ctx, inRecoverySQL).Scan(&inRecovery); err != nil {
		return fmt.Errorf("pgserver: promote: %w", err)
	}
	if inRecovery {
		return errors.New("pgserver: promoted, but the server is still in recovery")
	}
	return nil
}

// Crash kills every process of the server at once (SIGKILL), as a machine
// that dies does: nothing more is written or sent to its standbys. Its
// data stays; Resume starts it again, with crash recovery.
func (s *Server) Crash() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// MultiHostURL returns a connection string for database db as the
// superuser naming every server in order, with
// target_session_attrs=read-write: clients connect to the first that
// accepts writes, and so follow a failover.
func MultiHostURL(db string, servers ...*Server) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = s.Host + ":" + strconv.Itoa(s.Port)
	}
	q := url.Values{"sslmode": {"disable"}, "target_session_attrs": {"read-write"}}
	return fmt.Sprintf("postgres://postgres@%s/%s?%s", strings.Join(hosts, ","), url.PathEscape(db), q.Encode())
}

// quoteConf quotes v as a postgresql.conf string.
func quoteConf(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// confText is settings as postgresql.conf lines, sorted by name.
func confText(settings map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	return b.String()
}
