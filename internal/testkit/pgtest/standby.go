package pgtest

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// standbyTimeout bounds making a standby, waiting for it to replay, and
// promoting it.
const standbyTimeout = 2 * time.Minute

// NewStandby starts a hot standby of primary for one test (see
// pgserver.Server.StartStandby), stopped when the test ends. A synchronous
// standby is first taken out of the primary's synchronous_standby_names,
// so that the primary's later cleanups do not wait for it.
func NewStandby(tb testing.TB, primary *pgserver.Server, opts pgserver.StandbyOptions) *pgserver.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	sb, err := primary.StartStandby(ctx, opts)
	if err != nil {
		tb.Fatalf("pgtest: start a standby: %v", err)
	}
	tb.Cleanup(func() {
		if opts.Synchronous {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			// The primary may be gone: a test that failed over.
			_ = primary.Configure(ctx, map[string]string{"synchronous_standby_names": "''"})
			cancel()
		}
		if err := sb.Stop(); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})
	return sb
}

// WaitReplayed waits until standby has replayed all the WAL primary has
// written so far.
func WaitReplayed(tb testing.TB, primary, standby *pgserver.Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
}

// Failover fails primary over to standby: it kills every process of the
// primary at once (pgserver.Server.Crash) and promotes the standby,
// returning once the standby accepts writes.
func Failover(tb testing.TB, primary, standby *pgserver.Server) {
	tb.Helper()
	primary.Crash()
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	if err := standby.Promote(ctx); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
}

// MultiHostDSN returns dsn, a connection URL for one of the servers, with
// every server named in order in its host list and, unless dsn sets it,
// target_session_attrs=read-write: the connection string of a client that
// follows a failover from one server to the next.
func MultiHostDSN(tb testing.TB, dsn string, servers ...*pgserver.Server) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", redact(dsn), err)
	}
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = s.Host + ":" + strconv.Itoa(s.Port)
	}
	u.Host = strings.Join(hosts, ",")
	q := u.Query()
	if q.Get("target_session_attrs") == "" {
		q.Set("target_session_attrs", "read-write")
	}
	u.RawQuery = q.Encode()
	return u.String()
}
