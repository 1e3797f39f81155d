// Package progress shows how far a long operation has got: a bar with the
// count, the rate and the time left when its output is a terminal, and
// otherwise (a pipe, a file, journald, a container log) a plain log line
// through the operation's slog logger every interval and at the end.
//
// The work code starts a Tracker on a Display with the total it expects
// (chunks, key ranges, estimated rows) and reports into it per chunk or
// batch, never per row. A nil *Display and the Trackers it starts do
// nothing, so library callers that pass none are unaffected. Commands get
// their Display from Command, service components from Service; the
// environment variable named by Env forces a mode for both.
package progress

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Env is the environment variable that chooses how progress is shown:
// "bar" draws a bar on the command's standard error even when it is not a
// terminal, "lines" logs plain lines even on a terminal, "off" shows
// nothing (service components included), and "auto" or an empty or
// unknown value lets the output decide.
const Env = "TIDEMARK_PROGRESS"

// DefaultEvery is how often a progress line is logged when no interval is
// given.
const DefaultEvery = 10 * time.Second

// Mode is how a Display shows progress.
type Mode int

// The modes of a Display.
const (
	// Off shows nothing.
	Off Mode = iota
	// Lines logs a plain line through the operation's logger every
	// interval and at the end.
	Lines
	// Bar draws a progress bar, with the count, the rate and the time
	// left, on a terminal.
	Bar
)

// String returns the mode's name as Env spells it.
func (m Mode) String() string {
	switch m {
	case Lines:
		return "lines"
	case Bar:
		return "bar"
	}
	return "off"
}

// envMode returns the mode Env forces, and false when it forces none.
func envMode() (Mode, bool) {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(Env))) {
	case "off", "none", "0", "false":
		return Off, true
	case "lines", "log", "plain":
		return Lines, true
	case "bar", "terminal", "tty":
		return Bar, true
	}
	return Off, false
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// Display is where the progress of a command's or a component's
// operations is shown. A nil *Display shows nothing. Its methods are safe
// for concurrent use.
type Display struct {
	mode  Mode
	out   io.Writer
	every time.Duration

	mu  sync.Mutex               // serialises drawing the bar and writing logs to out
	bar *progressbar.ProgressBar // the bar being drawn, if any
}

// New returns a Display in mode m. A bar is drawn on out, which Writer
// also passes logs to; lines are logged every every (DefaultEvery when
// not positive).
func New(m Mode, out io.Writer, every time.Duration) *Display {
	if every <= 0 {
		every = DefaultEvery
	}
	if out == nil {
		out = io.Discard
	}
	return &Display{mode: m, out: out, every: every}
}

// Command returns the Display of a foreground command whose diagnostics go
// to stderr: a bar when stderr is a terminal, lines otherwise, unless Env
// forces a mode. Its logger should write to the Display's Writer, so that
// log lines and the bar do not overwrite each other.
func Command(stderr io.Writer, every time.Duration) *Display {
	m, forced := envMode()
	if !forced {
		m = Lines
		if IsTerminal(stderr) {
			m = Bar
		}
	}
	return New(m, stderr, every)
}

// Service returns the Display of a long-running service component: lines
// through the component's logger, unless Env is "off". A service never
// draws a bar.
func Service(every time.Duration) *Display {
	if m, forced := envMode(); forced && m == Off {
		return nil
	}
	return New(Lines, io.Discard, every)
}

// Mode returns how d shows progress.
func (d *Display) Mode() Mode {
	if d == nil {
		return Off
	}
	return d.mode
}

// Writer returns the writer that the command's logger should write to: in
// bar mode it clears the bar before each log line and draws it again
// after, otherwise it is the Display's output itself. It is io.Discard for
// a nil Display.
func (d *Display) Writer() io.Writer {
	if d == nil {
		return io.Discard
	}
	if d.mode != Bar {
		return d.out
	}
	return logWriter{d}
}

// logWriter writes log lines to a Display's output around its bar.
type logWriter struct{ d *Display }

// Write implements io.Writer.
func (w logWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	if w.d.bar != nil {
		_ = w.d.bar.Clear()
	}
	n, err := w.d.out.Write(p)
	if w.d.bar != nil {
		_ = w.d.bar.RenderBlank()
	}
	return n, err
}

// Job describes an operation whose progress is shown.
type Job struct {
	// Label names the operation: the bar's description, and the log
	// line's message followed by " progress" (e.g. "backfill").
	Label string
	// Unit is what is counted, plural (e.g. "chunks", "rows").
	Unit string
	// Total is how many units the operation expects; zero or less when
	// it is not known, which shows no time left.
	Total int64
	// Estimated says that Total is an estimate: the count may end below
	// or above it. A count beyond it raises the total, and a completed
	// operation's total becomes its count.
	Estimated bool
}

// Start begins showing the progress of job, logging lines through log in
// lines mode (nil discards them). The Tracker must be finished. Only one
// bar is drawn at a time: a job started while another's bar is drawn is
// shown as lines.
func (d *Display) Start(log *slog.Logger, job Job) *Tracker {
	if d == nil || d.mode == Off {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if job.Unit == "" {
		job.Unit = "items"
	}
	t := &Tracker{d: d, log: log, job: job, total: max(job.Total, 0), started: time.Now()}
	d.mu.Lock()
	if d.mode == Bar && d.bar == nil {
		t.bar = newBar(d.out, job)
		d.bar = t.bar
	}
	d.mu.Unlock()
	if t.bar == nil {
		t.stop, t.stopped = make(chan struct{}), make(chan struct{})
		go t.tick(d.every)
	}
	return t
}

// newBar returns a bar of job drawn on out, rendered at once.
func newBar(out io.Writer, job Job) *progressbar.ProgressBar {
	total := job.Total
	if total <= 0 {
		total = -1 // a spinner: nothing is known of the time left
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(out),
		progressbar.OptionSetDescription(job.Label),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(job.Unit),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowElapsedTimeOnFinish(),
		// Redrawn only when reported into (per chunk or batch, so
		// rarely) or around a log line: no goroutine of its own.
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }),
	)
}

// Tracker is the progress of one operation. A nil *Tracker does nothing.
// Its methods are safe for concurrent use.
type Tracker struct {
	d       *Display
	log     *slog.Logger
	job     Job
	started time.Time
	bar     *progressbar.ProgressBar // nil in lines mode

	mu       sync.Mutex
	done     int64
	total    int64
	finished bool
	ticked   bool // a periodic line was logged

	stop, stopped chan struct{} // the line ticker's, in lines mode
}

// Add counts n more units done.
func (t *Tracker) Add(n int64) {
	if t == nil || n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return
	}
	t.done += n
	grow := t.job.Estimated && t.total > 0 && t.done >= t.total
	if grow {
		// An estimate fell short: keep the bar open until the
		// operation says it is complete.
		t.total = t.done + max(t.done/10, 1)
	}
	if t.bar == nil {
		return
	}
	t.d.mu.Lock()
	defer t.d.mu.Unlock()
	if grow {
		t.bar.ChangeMax64(t.total)
	}
	_ = t.bar.Add64(n)
}

// SetTotal replaces the total (zero or less: not known).
func (t *Tracker) SetTotal(total int64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return
	}
	t.total = max(total, 0)
	if t.bar != nil && t.total > t.done {
		t.d.mu.Lock()
		t.bar.ChangeMax64(t.total)
		t.d.mu.Unlock()
	}
}

// Finish ends the display of the operation: the bar is completed or left
// where it stands, or the last line is logged (unless nothing was done
// and no line was logged yet). complete says that the
// operation did all its work, which makes an estimated total (or an
// unknown one) its count. Only the first call counts, so a deferred
// Finish(false) may back up a Finish(true) on success.
func (t *Tracker) Finish(complete bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.finished {
		t.mu.Unlock()
		return
	}
	t.finished = true
	if complete && (t.job.Estimated || t.total == 0) {
		t.total = t.done
	}
	t.mu.Unlock()
	if t.bar == nil {
		close(t.stop)
		<-t.stopped
		if t.done > 0 || t.ticked {
			// A job that did nothing within an interval (a poll of an
			// empty table, every poll.every) says nothing.
			t.line(true)
		}
		return
	}
	t.d.mu.Lock()
	defer t.d.mu.Unlock()
	switch {
	case t.bar.IsFinished():
	case complete && t.done > 0 && (t.job.Estimated || t.job.Total <= 0):
		t.bar.ChangeMax64(t.done)
		_ = t.bar.Finish()
	default:
		_ = t.bar.Exit()
	}
	if t.d.bar == t.bar {
		t.d.bar = nil
	}
}

// tick logs a line every every until the tracker is finished.
func (t *Tracker) tick(every time.Duration) {
	defer close(t.stopped)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			t.mu.Lock()
			t.ticked = true
			t.mu.Unlock()
			t.line(false)
		}
	}
}

// line logs the progress so far: done, total, the rate since the start
// and the time left at that rate.
func (t *Tracker) line(last bool) {
	t.mu.Lock()
	done, total := t.done, t.total
	t.mu.Unlock()
	elapsed := time.Since(t.started)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	args := []any{"done", done}
	if total > 0 {
		args = append(args, "total", total)
	}
	args = append(args, "unit", t.job.Unit, "rate", formatRate(rate, t.job.Unit))
	switch {
	case total > 0 && done >= total:
		args = append(args, "eta", "0s")
	case total > 0 && rate > 0:
		left := time.Duration(float64(total-done) / rate * float64(time.Second))
		args = append(args, "eta", roundDuration(left).String())
	default:
		args = append(args, "eta", "unknown")
	}
	args = append(args, "elapsed", roundDuration(elapsed).String())
	if last {
		args = append(args, "finished", true)
	}
	t.log.Info(t.job.Label+" progress", args...)
}

// formatRate prints a rate per second with about three significant
// digits and no exponent.
func formatRate(r float64, unit string) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f %s/s", r, unit)
	case r >= 1:
		return fmt.Sprintf("%.1f %s/s", r, unit)
	}
	return fmt.Sprintf("%.3f %s/s", r, unit)
}

// roundDuration rounds to the second, or to the millisecond below one.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
