package pgtest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
)

// EnvCitus names the variable that, set to 1, makes NewDatabase and
// NewPool give every test a database on a Citus cluster (a coordinator and
// two workers started by the test binary) instead of on one server.
const EnvCitus = "TIDEMARK_TEST_CITUS"

// EnvRequireCitus names the variable that, set to 1, makes a missing Citus
// a test failure instead of a skip, so that a run meant for Citus cannot
// pass without it.
const EnvRequireCitus = "TIDEMARK_REQUIRE_CITUS"

// OnCitus reports whether this test binary puts its databases on a Citus
// cluster (EnvCitus).
func OnCitus() bool { return os.Getenv(EnvCitus) == "1" }

// OnlyOnCitus skips a test that runs only where this test binary puts
// its databases on a Citus cluster (EnvCitus, as make test-citus sets).
func OnlyOnCitus(tb testing.TB) {
	tb.Helper()
	if !OnCitus() {
		tb.Skip("a Citus test: make test-citus runs it (" + EnvCitus + "=1)")
	}
}

// RequireCitus skips the test when the Citus extension is not installed
// for the server binaries, or fails it under EnvRequireCitus.
func RequireCitus(tb testing.TB) {
	tb.Helper()
	if pgserver.HasLibrary("citus") {
		return
	}
	if os.Getenv(EnvRequireCitus) == "1" {
		tb.Fatalf("pgtest: %s=1 but the citus extension is not installed for the PostgreSQL server binaries", EnvRequireCitus)
	}
	tb.Skip("the citus extension is not installed for the PostgreSQL server binaries")
}

// Cluster is a Citus cluster of servers owned by the test binary.
type Cluster struct {
	Coordinator *pgserver.Server
	Workers     []*pgserver.Server

	// registering serialises citus_add_node across the test databases:
	// each registration copies the cluster's roles to the worker, and two
	// at once fail there with "tuple concurrently updated".
	registering sync.Mutex
}

var (
	sharedClusterOnce sync.Once
	sharedCluster     *Cluster
	sharedClusterErr  error
)

// citusSettings are the settings of every node: Citus loaded, and its
// connections between nodes without TLS (the test servers have none). Four
// shards per distributed table keep the many small tables of tests cheap.
var citusSettings = map[string]string{
	"shared_preload_libraries":  "'citus'",
	"citus.node_conninfo":       "'sslmode=disable'",
	"citus.shard_count":         "4",
	"max_prepared_transactions": "400",
}

// StartCluster starts a private Citus cluster of a coordinator and the
// given number of workers for one test, stopped when it ends.
func StartCluster(tb testing.TB, workers int) *Cluster {
	tb.Helper()
	return StartClusterWith(tb, workers, pgserver.Options{})
}

// StartClusterWith is StartCluster with every node started with opts, to
// which the Citus settings are added; opts.Settings may override them
// (citus.shard_count, say).
func StartClusterWith(tb testing.TB, workers int, opts pgserver.Options) *Cluster {
	tb.Helper()
	RequireCitus(tb)
	c, err := startCluster(workers, opts)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.stop(); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})
	return c
}

// SharedCluster returns the test binary's Citus cluster (a coordinator and
// two workers), started on first use and stopped by Main.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	RequireCitus(tb)
	sharedClusterOnce.Do(func() { sharedCluster, sharedClusterErr = startCluster(2, pgserver.Options{}) })
	if sharedClusterErr != nil {
		tb.Fatalf("pgtest: %v", sharedClusterErr)
	}
	return sharedCluster
}

func startCluster(workers int, opts pgserver.Options) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	settings := maps.Clone(citusSettings)
	maps.Copy(settings, opts.Settings)
	opts.Settings = settings
	c := &Cluster{}
	for i := 0; i <= workers; i++ {
		srv, err := pgserver.Start(ctx, opts)
		if err != nil {
			_ = c.stop()
			return nil, fmt.Errorf("start a Citus node: %w", err)
		}
		if i == 0 {
			c.Coordinator = srv
		} else {
			c.Workers = append(c.Workers, srv)
		}
	}
	return c, nil
}

func (c *Cluster) stop() error {
	var first error
	for _, s := range append([]*pgserver.Server{c.Coordinator}, c.Workers...) {
		if s == nil {
			continue
		}
		if err := s.Stop(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Nodes returns the coordinator and the workers.
func (c *Cluster) Nodes() []*pgserver.Server {
	return append([]*pgserver.Server{c.Coordinator}, c.Workers...)
}

// ClusterOptions change how a test database is set up on a cluster.
type ClusterOptions struct {
	// WorkerAddrs, when set, are the addresses (host:port) the coordinator
	// registers its workers under, in the order of Cluster.Workers: a
	// fault proxy in front of a worker puts the cluster's own traffic to
	// it through the faults.
	WorkerAddrs []string
	// Register, when positive, registers only the first Register workers;
	// the others have the database and the extension, for a test that adds
	// them itself (to rebalance shards onto them, say).
	Register int
}

// NewDatabase creates a database of the same name on every node with the
// citus extension, registers the workers with the coordinator, and
// returns the coordinator's connection URL. The databases are dropped
// when the test ends.
func (c *Cluster) NewDatabase(tb testing.TB, opts ClusterOptions) string {
	tb.Helper()
	name := newName()
	for _, s := range c.Nodes() {
		createNamed(tb, s.URL("postgres"), name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range c.Workers {
		exec1(ctx, tb, s.URL(name), "CREATE EXTENSION citus")
	}
	conn, err := pgx.Connect(ctx, c.Coordinator.URL(name))
	if err != nil {
		tb.Fatalf("pgtest: connect to the coordinator: %v", err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"CREATE EXTENSION citus", fmt.Sprintf("SELECT citus_set_coordinator_host('%s', %d)", c.Coordinator.Host, c.Coordinator.Port)} {
		if _, err := conn.Exec(ctx, q); err != nil {
			tb.Fatalf("pgtest: %s: %v", q, err)
		}
	}
	c.registering.Lock()
	defer c.registering.Unlock()
	for i, w := range c.Workers {
		if opts.Register > 0 && i >= opts.Register {
			break
		}
		host, port := w.Host, w.Port
		if i < len(opts.WorkerAddrs) {
			h, p, err := net.SplitHostPort(opts.WorkerAddrs[i])
			if err != nil {
				tb.Fatalf("pgtest: worker address %q: %v", opts.WorkerAddrs[i], err)
			}
			host = h
			if port, err = strconv.Atoi(p); err != nil {
				tb.Fatalf("pgtest: worker address %q: %v", opts.WorkerAddrs[i], err)
			}
		}
		if _, err := conn.Exec(ctx, "SELECT citus_add_node($1, $2)", host, port); err != nil {
			tb.Fatalf("pgtest: add worker %s:%d: %v\nworker log:\n%s", host, port, err, w.LogTail())
		}
	}
	return c.Coordinator.URL(name)
}

// NewDatabaseBehindProxy is NewDatabase with the worker of index worker
// registered through a fault proxy, which it returns: the cluster's own
// traffic to that worker (a COMMIT PREPARED, say) can then be held back.
func (c *Cluster) NewDatabaseBehindProxy(tb testing.TB, worker int) (string, *faultproxy.Proxy) {
	tb.Helper()
	return c.NewDatabaseBehindProxyWith(tb, worker, ClusterOptions{})
}

// NewDatabaseBehindProxyWith is NewDatabaseBehindProxy with opts, whose
// WorkerAddrs it fills in itself.
func (c *Cluster) NewDatabaseBehindProxyWith(tb testing.TB, worker int, opts ClusterOptions) (string, *faultproxy.Proxy) {
	tb.Helper()
	w := c.Workers[worker]
	proxy, err := faultproxy.New(fmt.Sprintf("%s:%d", w.Host, w.Port))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { _ = proxy.Close() })
	opts.WorkerAddrs = make([]string, len(c.Workers))
	for i, w := range c.Workers {
		opts.WorkerAddrs[i] = fmt.Sprintf("%s:%d", w.Host, w.Port)
	}
	opts.WorkerAddrs[worker] = proxy.Addr()
	return c.NewDatabase(tb, opts), proxy
}

func exec1(ctx context.Context, tb testing.TB, dsn, sql string) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("pgtest: connect %s: %v", redact(dsn), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// placementSQL says how Citus knows a table: "distributed by <column>",
// "reference by <column>" and the like, or "" when it does not.
const placementSQL = `
SELECT coalesce((SELECT citus_table_type || ' by ' || distribution_column FROM citus_tables WHERE table_name = $1::regclass), '')`

// Placement returns how the Citus warehouse q is connected to places
// table (a quoted, qualified name): "distributed by event_id", say, or
// "" for a table Citus does not know, which stays on the coordinator.
func Placement(tb testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) string {
	tb.Helper()
	var kind string
	if err := q.QueryRow(context.Background(), placementSQL, table).Scan(&kind); err != nil {
		tb.Fatalf("placement of %s: %v", table, err)
	}
	return kind
}

// LocalAndDistributed runs test as the subtest "local", and where this
// test binary puts its databases on a Citus cluster (OnCitus) again as
// "distributed", telling it which: a test of a table that a Citus
// warehouse may hold either way.
func LocalAndDistributed(t *testing.T, test func(t *testing.T, distributed bool)) {
	t.Helper()
	for _, distributed := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "distributed"}[distributed], func(t *testing.T) {
			if distributed {
				OnlyOnCitus(t)
			}
			test(t, distributed)
		})
	}
}
