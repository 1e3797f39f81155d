package demo

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// citusWorkers is how many workers the demonstration's cluster has.
const citusWorkers = 2

// citusSettings load Citus on every node of the demonstration's cluster;
// the nodes talk to each other without TLS, which the throwaway servers
// do not have.
var citusSettings = map[string]string{
	"shared_preload_libraries":  "'citus'",
	"citus.node_conninfo":       "'sslmode=disable'",
	"max_prepared_transactions": "100",
}

// errNoCitus says why `tidemark demo --citus` cannot run.
var errNoCitus = errors.New("--citus: the citus extension is not installed for the PostgreSQL server binaries (docs/citus.md says how to install it)")

// startCluster starts a Citus coordinator and its workers, with the
// extension in each one's postgres database (the warehouse) and the
// workers registered; it returns the coordinator and a function that
// stops every node.
func startCluster(ctx context.Context, out io.Writer) (*pgserver.Server, func(), error) {
	if !pgserver.HasLibrary("citus") {
		return nil, nil, errNoCitus
	}
	var nodes []*pgserver.Server
	stop := func() {
		for _, n := range nodes {
			_ = n.Stop()
		}
	}
	for i := 0; i <= citusWorkers; i++ {
		role := "the Citus coordinator"
		if i > 0 {
			role = fmt.Sprintf("Citus worker %d", i)
		}
		fmt.Fprintf(out, "  %s ... ", role)
		n, err := pgserver.Start(ctx, pgserver.Options{Settings: citusSettings})
		if err != nil {
			stop()
			return nil, nil, err
		}
		nodes = append(nodes, n)
		fmt.Fprintf(out, "listening on %s:%d\n", n.Host, n.Port)
	}
	type step struct {
		node *pgserver.Server
		sql  string
		args []any
	}
	coord := nodes[0]
	steps := []step{{coord, "CREATE EXTENSION citus", nil}, {coord, "SELECT citus_set_coordinator_host($1, $2)", []any{coord.Host, coord.Port}}}
	for _, w := range nodes[1:] {
		steps = append(steps, step{w, "CREATE EXTENSION citus", nil})
	}
	for _, w := range nodes[1:] {
		steps = append(steps, step{coord, "SELECT citus_add_node($1, $2)", []any{w.Host, w.Port}})
	}
	for _, s := range steps {
		if err := execOn(ctx, s.node, s.sql, s.args...); err != nil {
			stop()
			return nil, nil, fmt.Errorf("set up the Citus cluster: %s: %w", s.sql, err)
		}
	}
	fmt.Fprintf(out, "  the warehouse: the coordinator's postgres database, with the citus extension and %d workers\n", citusWorkers)
	return coord, stop, nil
}

// execOn runs one statement in the postgres database of node.
func execOn(ctx context.Context, node *pgserver.Server, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, node.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// cluster shows where a Citus warehouse keeps the rows: the raw events
// spread over the workers by event id, the CDC mirror distributed by its
// key, tidemark's own tables, the poll mirror and the aggregate on the
// coordinator, and the rebuild's plan aggregating on each worker.
func (d *run) cluster() error {
	for _, t := range []struct{ title, sql string }{
		{"on Citus: raw.app_events is distributed by event_id; each worker holds the rows of its shards", `
WITH placed AS MATERIALIZED (
  SELECT get_shard_id_for_distribution_column('raw.app_events', event_id) AS shardid, event_time FROM raw.app_events),
w AS (SELECT nodename, nodeport, 'worker ' || row_number() OVER (ORDER BY nodeport) AS node
      FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0)
SELECT w.node, count(*) AS events, count(DISTINCT (p.event_time AT TIME ZONE 'UTC')::date) AS event_dates
FROM placed p JOIN citus_shards s USING (shardid) JOIN w USING (nodename, nodeport)
GROUP BY 1 ORDER BY 1`},
		{"on Citus: what else the warehouse holds; the CDC mirror is distributed by its key, tidemark's own tables stay on the coordinator, written in the same transactions as the rows", `
SELECT c.oid::regclass::text AS "table",
       coalesce(p.citus_table_type, 'on the coordinator') AS placement
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN citus_tables p ON p.table_name = c.oid
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND (n.nspname = 'raw' OR c.relname IN ('daily_sales', 'dw_orders', 'dw_customers', 'ingest_ledger', 'kafka_offsets', 'load_watermarks', 'partitions', 'dead_letters'))
ORDER BY placement, 1`},
	} {
		if err := d.table(t.title, t.sql); err != nil {
			return err
		}
	}
	return nil
}
