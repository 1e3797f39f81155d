package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// citusBenchSettings are the settings of the cluster BenchmarkCitus
// measures: those of durableServer. The shard count is set on each
// database, as docs/citus.md says to.
var citusBenchSettings = map[string]string{
	"shared_buffers": "512MB", "max_wal_size": "4GB", "checkpoint_timeout": "15min",
}

// sizingCores is the number of cores per node the sizing table assumes.
const sizingCores = 8

// BenchmarkCitus compares, on the same machine and the same rows, a Citus
// cluster (a coordinator and TIDEMARK_BENCH_CITUS_WORKERS workers, 2) with
// one PostgreSQL server, with TIDEMARK_BENCH_CITUS_SHARDS shards (32,
// Citus's default) per distributed table: (a) COPY into the raw table and (b) tidemark from
// Kafka, in alternating rounds; then (c) the rebuild of one day's
// partition, and on the cluster the same rebuild with the aggregate table
// distributed by its partition column and as a reference table. It
// reports each cluster/one-server ratio and the CPU each node spent per
// million events and per rebuild, and derives from those costs the sizing
// table of docs/citus.md. Every node shares this machine's cores, so the
// ratios here show the cluster's overhead, not its scale.
func BenchmarkCitus(b *testing.B) {
	pgtest.RequireCitus(b)
	n := size("TIDEMARK_BENCH_CITUS_EVENTS", 1_000_000, 100_000)
	perDay := size("TIDEMARK_BENCH_PARTITION_EVENTS", 200_000, 20_000)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	workers := envInt("TIDEMARK_BENCH_CITUS_WORKERS", 2)
	shards := envInt("TIDEMARK_BENCH_CITUS_SHARDS", 32)
	one := &env{srv: durableServer(b)}
	cl := pgtest.StartClusterWith(b, workers, pgserver.Options{Durable: true, Settings: citusBenchSettings})
	multi := &env{srv: cl.Coordinator, cluster: cl, shards: shards}
	recs, avg := workload(n)
	kc := newCluster(b, parts)
	one.kc, multi.kc = kc, kc
	end := one.produce(b, recs)
	for range b.N {
		fmt.Fprintf(os.Stderr, "\nCitus: a coordinator and %d workers (%d shards a table) against one server, all on this machine's %d cores; %d events of ~%.0f bytes on %d partitions\n",
			workers, shards, runtime.NumCPU(), n, avg, parts)
		// Each server's first gigabyte of WAL creates its segment files;
		// one untimed COPY on each pays for that.
		one.measureCopy(b, recs)
		multi.measureCopy(b, recs)
		var copyRatios, tmRatios []float64
		var oneTM, multiTM []cpuUse
		for r := range rounds {
			var rates [4]float64
			var uses [4]cpuUse
			measure := []func(){
				func() { rates[0] = one.measureCopy(b, recs); uses[0] = one.cpu },
				func() { rates[1], _ = one.measureTidemark(b, end, n); uses[1] = one.cpu },
				func() { rates[2] = multi.measureCopy(b, recs); uses[2] = multi.cpu },
				func() { rates[3], _ = multi.measureTidemark(b, end, n); uses[3] = multi.cpu },
			}
			order := []int{0, 1, 2, 3}
			if r%2 == 1 {
				order = []int{2, 3, 0, 1}
			}
			for _, i := range order {
				measure[i]()
			}
			copyRatios, tmRatios = append(copyRatios, rates[2]/rates[0]), append(tmRatios, rates[3]/rates[1])
			oneTM, multiTM = append(oneTM, uses[1]), append(multiTM, uses[3])
			fmt.Fprintf(os.Stderr, "  round %d: COPY %9.0f rows/s one server, %9.0f cluster (%.2f); tidemark %9.0f rows/s one server, %9.0f cluster (%.2f)\n",
				r+1, rates[0], rates[2], rates[2]/rates[0], rates[1], rates[3], rates[3]/rates[1])
			fmt.Fprintf(os.Stderr, "           tidemark on one server: %s\n           tidemark on the cluster: %s\n",
				perMillion(uses[1]), perMillion(uses[3]))
		}
		copyRatio, tmRatio := medianOf(copyRatios), medianOf(tmRatios)
		b.ReportMetric(copyRatio, "cluster/one_copy")
		b.ReportMetric(tmRatio, "cluster/one_tidemark")
		oneCost, multiCost := medianCost(oneTM), medianCost(multiTM)
		checkShards(b, multi.last, shards)
		one.settle(b)
		multi.settle(b)
		one.last, multi.last = "", ""

		rb := measureRebuilds(b, one, multi, perDay)
		b.ReportMetric(rb.multi.wall.Seconds()/rb.one.wall.Seconds(), "cluster/one_rebuild")

		fmt.Fprintf(os.Stderr, `
Citus against one server, medians:
  COPY into the raw table          cluster/one = %.2f
  tidemark from Kafka              cluster/one = %.2f
  rebuild of a day of %d events    cluster/one = %.2f (%s against %s)
`, copyRatio, tmRatio, perDay, rb.multi.wall.Seconds()/rb.one.wall.Seconds(), rb.multi.wall.Round(time.Millisecond), rb.one.wall.Round(time.Millisecond))
		for _, p := range rb.placements {
			fmt.Fprintf(os.Stderr, "  rebuild, aggregate table %-28s %s (%.2f of the coordinator-local table's)\n", p.name, p.wall.Round(time.Millisecond), p.wall.Seconds()/rb.multi.wall.Seconds())
		}
		fmt.Fprint(os.Stderr, sizingTable(workers, shards, perDay, oneCost, multiCost, rb))
	}
}

// checkShards fails the benchmark unless the raw table in dsn has the
// shards the database's citus.shard_count asked for.
func checkShards(b *testing.B, dsn string, shards int) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var got int
	if err := conn.QueryRow(ctx, `SELECT shard_count FROM citus_tables WHERE table_name = 'raw.app_events'::regclass`).Scan(&got); err != nil {
		b.Fatal(err)
	}
	if got != shards {
		b.Fatalf("raw.app_events has %d shards, want the database's citus.shard_count, %d", got, shards)
	}
}

// nodeCost is the CPU seconds each node spent on a unit of work: per
// million events for ingest, per rebuild for rebuilds. workers is their
// sum over the workers.
type nodeCost struct {
	coordinator, workers, process float64
	wall                          time.Duration
}

// costOf is u per million rows, or per unit when units is given.
func costOf(u cpuUse, units float64) nodeCost {
	c := nodeCost{coordinator: u.nodes[0].Seconds() / units, process: u.rest.Seconds() / units, wall: time.Duration(float64(u.wall) / units)}
	for _, w := range u.nodes[1:] {
		c.workers += w.Seconds() / units
	}
	return c
}

// medianCost is the per-million-rows cost of the measurement with the
// median CPU on the servers.
func medianCost(us []cpuUse) nodeCost {
	costs := make([]nodeCost, len(us))
	for i, u := range us {
		costs[i] = costOf(u, float64(u.rows)/1e6)
	}
	slices.SortFunc(costs, func(a, b nodeCost) int { return cmp.Compare(a.coordinator+a.workers, b.coordinator+b.workers) })
	return costs[len(costs)/2]
}

// perMillion describes u's CPU per million rows by node.
func perMillion(u cpuUse) string {
	c := costOf(u, float64(u.rows)/1e6)
	var s strings.Builder
	fmt.Fprintf(&s, "CPU per million rows: server %.2f s", c.coordinator)
	if len(u.nodes) > 1 {
		s.Reset()
		fmt.Fprintf(&s, "CPU per million rows: coordinator %.2f s, workers %.2f s", c.coordinator, c.workers)
	}
	fmt.Fprintf(&s, ", the benchmark's process (tidemark and the broker) %.2f s", c.process)
	return s.String()
}

// rebuilds is what measureRebuilds found: the median rebuild on one
// server and on the cluster, and on the cluster with the aggregate table
// placed otherwise.
type rebuilds struct {
	one, multi nodeCost
	placements []placement
}

type placement struct {
	name string
	wall time.Duration
}

// rebuildRounds is how many rebuilds each median is of.
const rebuildRounds = 9

// measureRebuilds loads three days of perDay events on one server and on
// the cluster and rebuilds the last day on each, alternating; then, on the
// cluster, with the aggregate table distributed by its partition column
// and as a reference table.
func measureRebuilds(b *testing.B, one, multi *env, perDay int) rebuilds {
	b.Helper()
	ctx := context.Background()
	h1 := loadHistoryIn(b, one.newDatabase(b), 3, perDay)
	hc := loadHistoryIn(b, multi.newDatabase(b), 3, perDay)
	def1, conn1 := rebuildTarget(b, h1)
	defc, connc := rebuildTarget(b, hc)
	rebuild := func(e *env, h *historyDB, def *aggregate.Definition, conn *pgx.Conn) cpuUse {
		cpu := markCPU(b, e.servers()...)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := aggregate.Rebuild(ctx, tx, def, def.Of(h.last), h.now)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return cpu.since(b, e.servers()...)
	}
	var oneUses, multiUses []cpuUse
	for r := range rebuildRounds {
		if r%2 == 0 {
			oneUses = append(oneUses, rebuild(one, h1, def1, conn1))
			multiUses = append(multiUses, rebuild(multi, hc, defc, connc))
		} else {
			multiUses = append(multiUses, rebuild(multi, hc, defc, connc))
			oneUses = append(oneUses, rebuild(one, h1, def1, conn1))
		}
	}
	res := rebuilds{one: medianRebuild(oneUses), multi: medianRebuild(multiUses)}
	fmt.Fprintf(os.Stderr, "\nrebuilding one day of %d events, median of %d, alternating\n  one server: %s, CPU server %.3f s, the benchmark's process %.3f s\n  cluster:    %s, CPU coordinator %.3f s, workers %.3f s, the benchmark's process %.3f s\n",
		perDay, rebuildRounds, res.one.wall.Round(time.Millisecond), res.one.coordinator, res.one.process,
		res.multi.wall.Round(time.Millisecond), res.multi.coordinator, res.multi.workers, res.multi.process)
	for _, p := range []struct{ name, sql string }{
		{"distributed by sale_date", `SELECT create_distributed_table('daily_sales', 'sale_date', colocate_with => 'none')`},
		{"as a reference table", `SELECT undistribute_table('daily_sales'); SELECT create_reference_table('daily_sales')`},
	} {
		if _, err := connc.Exec(ctx, p.sql); err != nil {
			b.Fatalf("place the aggregate table %s: %v", p.name, err)
		}
		var uses []cpuUse
		for range rebuildRounds {
			uses = append(uses, rebuild(multi, hc, defc, connc))
		}
		c := medianRebuild(uses)
		res.placements = append(res.placements, placement{name: p.name, wall: c.wall})
	}
	return res
}

// rebuildTarget prepares daily_sales in h's database and returns it with
// a connection of its own.
func rebuildTarget(b *testing.B, h *historyDB) (*aggregate.Definition, *pgx.Conn) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	def, err := aggregate.FromConfig(h.cfg, "daily_sales")
	if err != nil {
		b.Fatal(err)
	}
	if err := aggregate.Prepare(ctx, conn, def); err != nil {
		b.Fatal(err)
	}
	return def, conn
}

// medianRebuild is the median wall time of the rebuilds, with their mean
// CPU on each node (one rebuild uses a few clock ticks of a node, too few
// to take one rebuild's).
func medianRebuild(us []cpuUse) nodeCost {
	var sum cpuUse
	walls := make([]time.Duration, len(us))
	for i, u := range us {
		walls[i] = u.wall
		sum.rest += u.rest
		if sum.nodes == nil {
			sum.nodes = make([]time.Duration, len(u.nodes))
		}
		for j, n := range u.nodes {
			sum.nodes[j] += n
		}
	}
	c := costOf(sum, float64(len(us)))
	slices.Sort(walls)
	c.wall = walls[len(walls)/2]
	return c
}

// sizingTable derives from the measured CPU costs what a cluster of W
// workers of sizingCores cores each can take, against one server of as
// many cores, assuming the CPU per event and per rebuild measured here
// (the workers' part split evenly among them, whatever their number, up
// to one worker a shard),
// every core busy, and disk and network not the limit.
func sizingTable(workers, shards, perDay int, one, multi nodeCost, rb rebuilds) string {
	var s strings.Builder
	fmt.Fprintf(&s, `
CPU per million events: one server %.2f s; cluster coordinator %.2f s, workers %.2f s in all (%d workers); tidemark's process %.2f s
CPU per rebuild of a day of %d events: one server %.3f s; cluster coordinator %.3f s, workers %.3f s in all

sizing, %d cores a node, every core busy, disk and network not the limit:
| workers | events/s, ingest | rebuilds/min | limited by |
| --- | --- | --- | --- |
| one server | %s | %s | the server |
`, one.coordinator, multi.coordinator, multi.workers, workers, multi.process,
		perDay, rb.one.coordinator, rb.multi.coordinator, rb.multi.workers,
		sizingCores, round3(sizingCores/one.coordinator*1e6), round3(60*sizingCores/rb.one.coordinator))
	for _, w := range []int{2, 4, 8, 16} {
		if w > shards {
			fmt.Fprintf(&s, "| %d | | | more workers than shards |\n", w)
			continue
		}
		coordEvents := sizingCores / multi.coordinator * 1e6
		workerEvents := float64(w*sizingCores) / multi.workers * 1e6
		coordRebuilds := 60 * sizingCores / rb.multi.coordinator
		workerRebuilds := 60 * float64(w*sizingCores) / rb.multi.workers
		var limits []string
		if coordEvents < workerEvents {
			limits = append(limits, "ingest by the coordinator")
		}
		if coordRebuilds < workerRebuilds {
			limits = append(limits, "rebuilds by the coordinator")
		}
		if len(limits) == 0 {
			limits = []string{"the workers"}
		}
		fmt.Fprintf(&s, "| %d | %s | %s | %s |\n", w, round3(min(coordEvents, workerEvents)), round3(min(coordRebuilds, workerRebuilds)), strings.Join(limits, ", "))
	}
	return s.String()
}

// round3 prints x rounded to three significant digits, with thousands
// separators.
func round3(x float64) string {
	if x <= 0 {
		return "0"
	}
	mag := 1.0
	for x/mag >= 1000 {
		mag *= 10
	}
	v := int64(float64(int64(x/mag+0.5)) * mag)
	digits := fmt.Sprint(v)
	var out []byte
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, byte(c))
	}
	return string(out)
}
