package bench

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuMark is the CPU time used up to one moment by the PostgreSQL servers
// (each postmaster and its children, live or reaped) and by the rest of
// this process's tree: the benchmark, tidemark's code in it, the
// in-process Kafka broker and the programs it runs, such as
// pg_recvlogical.
type cpuMark struct {
	at       time.Time
	pg, rest time.Duration
	nodes    []time.Duration // each server's part of pg, in the order given
}

// cpuUse is what a measurement used between two marks, and how many rows
// it wrote in that time (0: not counted).
type cpuUse struct {
	wall, pg, rest time.Duration
	nodes          []time.Duration
	rows           int64
}

// markCPU reads the CPU times now of the servers (one, or the nodes of a
// cluster) and of the rest of this process's tree.
func markCPU(b *testing.B, srvs ...*pgserver.Server) cpuMark {
	b.Helper()
	roots := make([]int, 0, len(srvs)+1)
	for _, srv := range srvs {
		pm := srv.Pid()
		if pm == 0 {
			b.Fatal("a PostgreSQL server is not running")
		}
		roots = append(roots, pm)
	}
	sums := treesCPU(append(roots, os.Getpid())...)
	m := cpuMark{at: time.Now()}
	var pg uint64
	for i, pm := range roots {
		if sums[i] == 0 {
			b.Fatalf("reading the CPU times of the PostgreSQL server (pid %d) from /proc failed", pm)
		}
		pg += sums[i]
		m.nodes = append(m.nodes, time.Duration(sums[i])*clockTick)
	}
	all := sums[len(roots)]
	if all < pg {
		b.Fatalf("reading the CPU times of this process's tree (pid %d) from /proc failed", os.Getpid())
	}
	m.pg, m.rest = time.Duration(pg)*clockTick, time.Duration(all-pg)*clockTick
	return m
}

// since is the use from m to now.
func (m cpuMark) since(b *testing.B, srvs ...*pgserver.Server) cpuUse {
	b.Helper()
	now := markCPU(b, srvs...)
	u := cpuUse{wall: now.at.Sub(m.at), pg: now.pg - m.pg, rest: now.rest - m.rest}
	for i := range now.nodes {
		u.nodes = append(u.nodes, now.nodes[i]-m.nodes[i])
	}
	return u
}

// String says how much CPU each side used and how busy that kept the
// machine.
func (u cpuUse) String() string {
	busy := (u.pg + u.rest).Seconds() / u.wall.Seconds()
	if u.rows > 0 {
		per := 1e6 / float64(u.rows)
		return fmt.Sprintf("CPU per million rows: PostgreSQL %.2f s, the benchmark's process %.2f s; %.2f of %d cores busy",
			u.pg.Seconds()*per, u.rest.Seconds()*per, busy, runtime.NumCPU())
	}
	return fmt.Sprintf("CPU: PostgreSQL %.1f s, the benchmark's process %.1f s, in %.1f s: %.2f of %d cores",
		u.pg.Seconds(), u.rest.Seconds(), u.wall.Seconds(), busy, runtime.NumCPU())
}

// serverProcs is the CPU time, in clock ticks, of each process of a
// PostgreSQL server at one moment, with what the process is: its title
// ("walsender", "autovacuum worker", a client backend's database). The
// postmaster's entry holds the time of its children that have exited.
type serverProcs map[int]serverProc

type serverProc struct {
	kind  string
	ticks uint64
}

// proc is a process as /proc/<pid>/stat shows it.
type proc struct {
	ppid   int
	zombie bool   // exited, not yet reaped: it shows no CPU time
	ticks  uint64 // CPU time, its own and that of the children it reaped
}

// readProcs reads every process of the machine.
func readProcs() map[int]proc {
	procs := map[int]proc{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return procs
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command, which is in parentheses: state,
		// ppid, ..., utime (12th), stime, cutime, cstime.
		_, rest, ok := strings.Cut(string(data), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 15 {
			continue
		}
		p := proc{zombie: f[0] == "Z"}
		p.ppid, _ = strconv.Atoi(f[1])
		for _, s := range f[11:15] {
			v, _ := strconv.ParseUint(s, 10, 64)
			p.ticks += v
		}
		procs[pid] = p
	}
	return procs
}

// readServerProcs reads the processes of the server whose postmaster is
// pm.
func readServerProcs(pm int) serverProcs {
	procs := serverProcs{}
	for pid, p := range readProcs() {
		if p.ppid != pm && pid != pm {
			continue
		}
		kind := "exited processes"
		if pid != pm {
			title, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			kind = procKind(string(bytes.TrimRight(title, "\x00")))
		}
		procs[pid] = serverProc{kind: kind, ticks: p.ticks}
	}
	return procs
}

// procKind names a server process by its title: "postgres: walsender
// ...", "postgres: autovacuum worker ...", "postgres: <user> <db> <client>
// <state>" for a client backend.
func procKind(title string) string {
	title = strings.TrimPrefix(title, "postgres: ")
	for _, k := range []string{"walsender", "autovacuum", "checkpointer", "walwriter", "background writer", "logical replication"} {
		if strings.HasPrefix(title, k) {
			return k
		}
	}
	if f := strings.Fields(title); len(f) >= 2 {
		return "backends of " + f[1]
	}
	return "other"
}

// since is the CPU each kind of process used from p to now, largest
// first, as "kind 1.2 s, ...".
func (p serverProcs) since(pm int) string {
	now := readServerProcs(pm)
	used := map[string]uint64{}
	for pid, q := range now {
		used[q.kind] += q.ticks - min(q.ticks, p[pid].ticks)
	}
	kinds := slices.Collect(maps.Keys(used))
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Compare(used[b], used[a]) })
	var parts []string
	for _, k := range kinds {
		if used[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f s", k, (time.Duration(used[k])*clockTick).Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}
