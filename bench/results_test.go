package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// quick is the development mode (TIDEMARK_BENCH_QUICK=1): every benchmark
// but BenchmarkPoll on fewer rows, results written outside the tree.
var quick = os.Getenv("TIDEMARK_BENCH_QUICK") != ""

// size returns the environment's value of name, or the full or quick
// default.
func size(name string, full, small int) int {
	if quick {
		return envInt(name, small)
	}
	return envInt(name, full)
}

// resultsDir is where the curves are written: TIDEMARK_BENCH_RESULTS, or
// docs/benchmarks (a quick run writes to a temporary directory instead,
// so that it never replaces the committed results).
func resultsDir() string {
	if d := os.Getenv("TIDEMARK_BENCH_RESULTS"); d != "" {
		return d
	}
	if quick {
		return filepath.Join(os.TempDir(), "tidemark-bench-quick")
	}
	return filepath.Join("..", "docs", "benchmarks")
}

// runMeta describes the run: machine, versions, command and mode.
func runMeta(b *testing.B, srv *pgserver.Server) map[string]string {
	b.Helper()
	m := map[string]string{
		"date":    time.Now().UTC().Format(time.RFC3339),
		"go":      runtime.Version(),
		"cpus":    strconv.Itoa(runtime.NumCPU()),
		"machine": cpuModel(),
		"memory":  memTotal(),
		"command": "make bench",
		"mode":    "full",
	}
	if quick {
		m["mode"] = "quick (TIDEMARK_BENCH_QUICK)"
	}
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TIDEMARK_BENCH_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	if len(env) > 0 {
		m["command"] = strings.Join(env, " ") + " make bench"
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "gonum.org/v1/plot" {
				m["gonum_plot"] = d.Version
			}
		}
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m["commit"] = strings.TrimSpace(string(out))
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&version); err != nil {
		b.Fatal(err)
	}
	m["postgresql"] = version + " (fsync and synchronous_commit on)"
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err == nil {
				return fmt.Sprintf("%.0f GiB", kb/(1<<20))
			}
		}
	}
	return ""
}

// saveCurve writes the table as JSON and the figure as SVG to the results
// directory, and prints the table.
func saveCurve(b *testing.B, t *benchplot.Table, fig benchplot.Figure) {
	b.Helper()
	dir := resultsDir()
	if err := t.WriteJSON(dir); err != nil {
		b.Fatal(err)
	}
	if err := fig.WriteSVG(filepath.Join(dir, t.Name+".svg")); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "\n%s (%s/%s.json, .svg)\n%s", t.Title, dir, t.Name, t.Markdown())
}

// series picks a series out of a table, failing the benchmark when a
// column is missing.
func series(b *testing.B, t *benchplot.Table, label, x, y string, where map[string]float64) benchplot.Series {
	b.Helper()
	s, err := t.Series(label, x, y, where)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// addRow appends a row, failing the benchmark when it does not fit.
func addRow(b *testing.B, t *benchplot.Table, values ...float64) {
	b.Helper()
	if err := t.Add(values...); err != nil {
		b.Fatal(err)
	}
}

// cpuMeter measures how busy the machine was with processes other than
// this benchmark and the servers it started (its descendants): another
// benchmark on the same machine shows up there.
type cpuMeter struct{ busy, total, ours uint64 }

// meterCPU starts a measurement.
func meterCPU() cpuMeter {
	busy, total := machineCPU()
	return cpuMeter{busy: busy, total: total, ours: treeCPU(os.Getpid())}
}

// otherCores returns the average number of cores that other processes
// kept busy since the meter started (0 to the number of CPUs).
func (m cpuMeter) otherCores() float64 {
	busy, total := machineCPU()
	ours := treeCPU(os.Getpid())
	if total <= m.total {
		return 0
	}
	other := float64(busy-m.busy) - float64(ours-m.ours)
	return max(0, other) / (float64(total-m.total) / float64(runtime.NumCPU()))
}

// machineCPU returns the busy and total clock ticks of all CPUs.
func machineCPU() (busy, total uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		if i >= 8 { // guest time is counted in user time already
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// treeCPU returns the clock ticks used by pid and its descendants,
// including the children they have reaped.
func treeCPU(root int) uint64 { return treesCPU(root)[0] }

// treesCPU is treeCPU for several roots, from one reading of /proc so that
// the sums are of the same moment. A root that is not running sums to 0.
//
// A process that has exited but is not yet reaped (a zombie, such as a
// walsender whose client just left) shows no CPU time, and its parent has
// not yet added it to its reaped children's: its time would be missing
// from the sum. So the reading is repeated, for up to a second, until the
// trees hold no zombie.
func treesCPU(roots ...int) []uint64 {
	var sums []uint64
	_ = waitfor.Poll(time.Second, func() bool {
		var zombies int
		sums, zombies = readTreesCPU(roots)
		return zombies == 0
	})
	return sums
}

// readTreesCPU reads the sums of treesCPU once, and counts the zombies in
// the trees.
func readTreesCPU(roots []int) ([]uint64, int) {
	sums := make([]uint64, len(roots))
	procs := readProcs()
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	zombies := 0
	for i, root := range roots {
		stack := []int{root}
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			sums[i] += procs[p].ticks
			if procs[p].zombie {
				zombies++
			}
			stack = append(stack, children[p]...)
		}
	}
	return sums, zombies
}
