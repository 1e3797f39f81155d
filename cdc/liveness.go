package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
)

// errSilent ends a stream whose replication connection stayed silent,
// neither data nor a keepalive, for longer than the bound of silence.
var errSilent = errors.New("replication connection silent")

// defaultWalSenderTimeout is PostgreSQL's default wal_sender_timeout,
// assumed when the source's cannot be read or is 0 (off).
const defaultWalSenderTimeout = time.Minute

const (
	showWalSenderTimeoutSQL = `SHOW wal_sender_timeout`
	tryLockSlotSQL          = `SELECT pg_try_advisory_lock(hashtextextended('tidemark.cdc.' || $1, 0))`
	pingSQL                 = `SELECT 1`
)

// silence is how long the stream may listen without hearing from the
// server before it gives the connection up: the source's
// wal_sender_timeout, the bound the server applies to us, and at least
// three status intervals. The stream asks for a reply at half of it.
func (r *Reader) silence(statusEvery time.Duration) time.Duration {
	d := r.walSenderTimeout
	if d <= 0 {
		d = defaultWalSenderTimeout
	}
	return max(d, 3*statusEvery)
}

// readWalSenderTimeout reads the replication session's wal_sender_timeout.
func (r *Reader) readWalSenderTimeout(ctx context.Context, repl *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	defer cancel()
	res, err := repl.Exec(ctx, showWalSenderTimeoutSQL).ReadAll()
	r.walSenderTimeout = 0
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		r.log.Debug("cannot read wal_sender_timeout; assuming the default", "err", err)
		return
	}
	r.walSenderTimeout = parseGUCDuration(string(res[0].Rows[0][0]))
}

// parseGUCDuration reads a time setting as SHOW prints it (500ms, 60s, 1min,
// 0); zero when it cannot.
func parseGUCDuration(s string) time.Duration {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"s", time.Second}, {"min", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour}} {
		if n, ok := cutNumber(s, u.suffix); ok {
			return time.Duration(n) * u.unit
		}
	}
	return 0
}

func cutNumber(s, suffix string) (int64, bool) {
	if len(s) <= len(suffix) || s[len(s)-len(suffix):] != suffix {
		return 0, false
	}
	var n int64
	for _, c := range s[:len(s)-len(suffix)] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = 10*n + int64(c-'0')
	}
	return n, true
}

// lockSlot takes the slot's advisory lock on lock, trying every second
// while another session holds it, each try bounded by r.waitTimeout. The lock
// session ends itself after r.waitTimeout idle (idle_session_timeout), so that a
// session the client lost does not hold the lock; keepLock keeps a
// healthy one busy.
func (r *Reader) lockSlot(ctx context.Context, lock *pgx.Conn) error {
	for {
		tctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
		var ok bool
		err := lock.QueryRow(tctx, tryLockSlotSQL, r.conf.Slot).Scan(&ok)
		cancel()
		if err != nil {
			return fmt.Errorf("wait for the slot's lock: %w", err)
		}
		if ok {
			return nil
		}
		if r.opts.slotLockBusy != nil {
			r.opts.slotLockBusy()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// errLockReadOnly ends a run whose lock session's server turned
// read-only.
var errLockReadOnly = errors.New("its server is read-only (the warehouse failed over, or was fenced)")

// keepLock pings the lock session every quarter of r.waitTimeout until
// ctx ends; a ping that fails or does not answer within r.waitTimeout/4
// calls lost, and ends the pings. So does a session whose server has
// turned read-only (pgconnect.ReadOnlySession; the ping brings the news):
// the warehouse failed over, and the lock must be held on the new
// primary, where another reader would otherwise take it, not on the old
// one, where the session only reads and would never fail.
func (r *Reader) keepLock(ctx context.Context, lock *pgx.Conn, lost func(error)) {
	every := r.waitTimeout / 4
	job := periodic.Job{Name: "slot lock ping", Every: every, FromStart: true, Timeout: every,
		Run: func(pctx context.Context) error {
			if _, err := lock.Exec(pctx, pingSQL); err != nil {
				return err
			}
			if pgconnect.ReadOnlySession(lock.PgConn()) {
				return errLockReadOnly
			}
			return nil
		},
		Final: func(error) bool { return true }}
	if err := job.Loop(ctx); err != nil {
		lost(fmt.Errorf("the slot's lock session: %w", err))
	}
}
