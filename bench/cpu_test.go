package bench

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuMark is the CPU time used up to one moment by the PostgreSQL server
// (the postmaster and its children, live or reaped) and by the rest of
// this process's tree: the benchmark, tidemark's code in it, the
// in-process Kafka broker and the programs it runs, such as
// pg_recvlogical.
type cpuMark struct {
	at       time.Time
	pg, rest time.Duration
}

// cpuUse is what a measurement used between two marks, and how many rows
// it wrote in that time (0: not counted).
type cpuUse struct {
	wall, pg, rest time.Duration
	rows           int64
}

// markCPU reads the CPU times now.
func markCPU(b *testing.B, srv *pgserver.Server) cpuMark {
	b.Helper()
	pm := srv.Pid()
	if pm == 0 {
		b.Fatal("the PostgreSQL server is not running")
	}
	sums := treesCPU(pm, os.Getpid())
	pg, all := sums[0], sums[1]
	if pg == 0 || all < pg {
		b.Fatalf("reading the CPU times of the PostgreSQL server (pid %d) from /proc failed", pm)
	}
	return cpuMark{at: time.Now(), pg: time.Duration(pg) * clockTick, rest: time.Duration(all-pg) * clockTick}
}

// since is the use from m to now.
func (m cpuMark) since(b *testing.B, srv *pgserver.Server) cpuUse {
	b.Helper()
	now := markCPU(b, srv)
	return cpuUse{wall: now.at.Sub(m.at), pg: now.pg - m.pg, rest: now.rest - m.rest}
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
