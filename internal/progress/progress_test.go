package progress_test

import (
	"bytes"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// barPattern matches a drawn bar of a job counted in chunks: the count,
// the rate and [elapsed:left].
var barPattern = regexp.MustCompile(`\(\d+/\d+, \d+ chunks/(s|min|hr)\) \[\d[0-9.hmsµn]*:\d[0-9.hmsµn]*\]`)

// TestLines: a Display in lines mode logs a plain line every interval
// while the job runs and one at the end, with the count, total, rate and
// time left, and never writes terminal control characters. The job waits
// for a line with each partial count before it goes on, however late the
// interval fires on a busy machine.
func TestLines(t *testing.T) {
	var out syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	d := progress.New(progress.Lines, &out, 20*time.Millisecond)
	tr := d.Start(log, progress.Job{Label: "backfill", Unit: "chunks", Total: 4})
	for i := range 3 {
		tr.Add(1)
		periodic := regexp.MustCompile(`msg="backfill progress" done=` + strconv.Itoa(i+1) + ` total=4 `)
		if waitfor.Poll(waitfor.Timeout, func() bool { return periodic.MatchString(out.String()) }) != nil {
			t.Fatalf("no line with done=%d within %s:\n%s", i+1, waitfor.Timeout, out.String())
		}
	}
	tr.Add(1)
	tr.Finish(true)
	tr.Finish(false) // a deferred backup changes nothing
	text := out.String()
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 4 {
		t.Fatalf("%d lines, want at least 3 periodic ones and a last one:\n%s", len(lines), text)
	}
	for _, l := range lines {
		if !strings.Contains(l, `msg="backfill progress"`) || !strings.Contains(l, "total=4") || !strings.Contains(l, "rate=") || !strings.Contains(l, "eta=") {
			t.Errorf("line %q lacks the message, total, rate or eta", l)
		}
	}
	last := lines[len(lines)-1]
	if !strings.Contains(last, "done=4") || !strings.Contains(last, "eta=0s") || !strings.Contains(last, "finished=true") {
		t.Errorf("last line %q, want done=4 eta=0s finished=true", last)
	}
	if !regexp.MustCompile(`done=[123] total=4 unit=chunks rate="\d+\.\d+ chunks/s" eta=\d`).MatchString(text) {
		t.Errorf("no periodic line with a partial count, a rate and a time left:\n%s", text)
	}
	if strings.ContainsAny(text, "\r\x1b") {
		t.Errorf("lines mode wrote terminal control characters: %q", text)
	}
	if d.Writer() != &out {
		t.Error("lines mode's log writer is not the output itself")
	}
}

// TestBar: a Display in bar mode draws the bar with count, rate and time
// left, completes it, and log lines written through its Writer land on
// lines of their own, the bar redrawn after them.
func TestBar(t *testing.T) {
	var out bytes.Buffer
	d := progress.New(progress.Bar, &out, 0)
	log := slog.New(slog.NewTextHandler(d.Writer(), nil))
	tr := d.Start(log, progress.Job{Label: "backfill", Unit: "chunks", Total: 3})
	tr.Add(1)
	log.Info("chunk done", "chunk", "2026-09-01")
	tr.Add(2)
	tr.Finish(true)
	text := out.String()
	if !barPattern.MatchString(text) {
		t.Errorf("no bar with count, rate and time left in %q", text)
	}
	if !strings.Contains(text, "backfill") || !strings.Contains(text, "(3/3,") || !strings.Contains(text, "100%") {
		t.Errorf("the bar was not completed: %q", text)
	}
	// The log line starts a line of its own and is followed by the bar.
	if !regexp.MustCompile(`\r *\rtime=\S+ level=INFO msg="chunk done" chunk=2026-09-01\n[^\n]*\(1/3`).MatchString(text) {
		t.Errorf("the log line was not written between a cleared and a redrawn bar: %q", text)
	}
	if strings.Contains(text, "progress done=") {
		t.Errorf("bar mode logged progress lines: %q", text)
	}
	if !strings.HasSuffix(text, "\n") {
		t.Errorf("the completed bar does not end its line: %q", text)
	}
}

// TestEstimated: an estimated total that the count passes grows instead
// of completing the bar early, and a completed job ends at its count.
func TestEstimated(t *testing.T) {
	var out bytes.Buffer
	d := progress.New(progress.Bar, &out, 0)
	tr := d.Start(nil, progress.Job{Label: "poll first load", Unit: "rows", Total: 100, Estimated: true})
	tr.Add(100)
	if strings.Contains(out.String(), "100%") {
		t.Errorf("the bar completed when the count reached the estimate: %q", out.String())
	}
	tr.Add(50)
	tr.Finish(true)
	if !strings.Contains(out.String(), "(150/150,") {
		t.Errorf("a completed job does not end at its count: %q", out.String())
	}

	var lines syncbuf.Buffer
	tr = progress.New(progress.Lines, nil, time.Hour).Start(slog.New(slog.NewTextHandler(&lines, nil)), progress.Job{Label: "snapshot", Unit: "rows", Total: 1000, Estimated: true})
	tr.Add(600)
	tr.Finish(true)
	if !strings.Contains(lines.String(), "done=600 total=600") {
		t.Errorf("a completed estimated job's last line: %q", lines.String())
	}
}

// TestNilAndOff: a nil Display, and one that is off, start trackers that
// do nothing; so does a job in lines mode that ends with nothing done
// before its first interval.
func TestNilAndOff(t *testing.T) {
	var d *progress.Display
	tr := d.Start(nil, progress.Job{Label: "x", Total: 1})
	tr.Add(1)
	tr.SetTotal(2)
	tr.Finish(true)
	if d.Mode() != progress.Off {
		t.Errorf("nil display in mode %v", d.Mode())
	}
	var out bytes.Buffer
	off := progress.New(progress.Off, &out, 0)
	off.Start(slog.New(slog.NewTextHandler(&out, nil)), progress.Job{Label: "x", Total: 1}).Finish(true)
	if out.Len() != 0 {
		t.Errorf("an Off display wrote %q", out.String())
	}
	// A job that did nothing within an interval logs nothing at all.
	progress.New(progress.Lines, &out, time.Hour).Start(slog.New(slog.NewTextHandler(&out, nil)), progress.Job{Label: "x"}).Finish(true)
	if out.Len() != 0 {
		t.Errorf("an empty job logged %q", out.String())
	}
}

// TestCommandMode: a command's Display draws a bar when its stderr is a
// terminal (a pseudo-terminal here) and logs lines otherwise;
// TIDEMARK_PROGRESS forces either, or turns it off, service components'
// included.
func TestCommandMode(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	var buf bytes.Buffer
	for _, tt := range []struct {
		env      string
		terminal bool
		want     progress.Mode
	}{
		{"", true, progress.Bar},
		{"", false, progress.Lines},
		{"auto", true, progress.Bar},
		{"lines", true, progress.Lines},
		{"bar", false, progress.Bar},
		{"off", true, progress.Off},
	} {
		t.Setenv(progress.Env, tt.env)
		var stderr any = &buf
		if tt.terminal {
			stderr = tty
		}
		var got progress.Mode
		if tt.terminal {
			got = progress.Command(tty, 0).Mode()
		} else {
			got = progress.Command(&buf, 0).Mode()
		}
		if got != tt.want {
			t.Errorf("%s=%q, stderr %T: mode %v, want %v", progress.Env, tt.env, stderr, got, tt.want)
		}
	}
	t.Setenv(progress.Env, "bar")
	if m := progress.Service(0).Mode(); m != progress.Lines {
		t.Errorf("a service's display with %s=bar is in mode %v, want lines", progress.Env, m)
	}
	t.Setenv(progress.Env, "off")
	if m := progress.Service(0).Mode(); m != progress.Off {
		t.Errorf("a service's display with %s=off is in mode %v", progress.Env, m)
	}
}

// BenchmarkAdd measures what reporting one chunk or batch costs the work
// code: lines mode counts it; bar mode also redraws the bar.
func BenchmarkAdd(b *testing.B) {
	for _, m := range []progress.Mode{progress.Off, progress.Lines, progress.Bar} {
		b.Run(m.String(), func(b *testing.B) {
			tr := progress.New(m, io.Discard, time.Hour).Start(nil, progress.Job{Label: "bench", Unit: "chunks", Total: 1 << 40})
			for b.Loop() {
				tr.Add(1)
			}
			tr.Finish(false)
		})
	}
}
