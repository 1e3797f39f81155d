package kafkatest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// LogLine is one record a LogRecorder kept, with its attributes as text.
type LogLine struct {
	Time  time.Time
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// String formats the line for test failures.
func (l LogLine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %q", l.Time.Format("15:04:05.000"), l.Level, l.Msg)
	for k, v := range l.Attrs {
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	return b.String()
}

// LogRecorder is a slog.Handler that keeps the records at or above its
// level, so that a test can check what a component logs and wait for a
// line instead of sleeping.
type LogRecorder struct {
	level slog.Level
	attrs []slog.Attr
	group string
	store *logStore
}

type logStore struct {
	mu      sync.Mutex
	lines   []LogLine
	changed chan struct{} // closed and replaced when a line arrives
}

// NewLogRecorder returns a recorder of the records at level and above.
func NewLogRecorder(level slog.Level) *LogRecorder {
	return &LogRecorder{level: level, store: &logStore{changed: make(chan struct{})}}
}

// Enabled implements slog.Handler.
func (r *LogRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

// Handle implements slog.Handler.
func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	line := LogLine{Time: rec.Time, Level: rec.Level, Msg: rec.Message, Attrs: map[string]string{}}
	for _, a := range r.attrs {
		line.Attrs[a.Key] = a.Value.Resolve().String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		line.Attrs[r.group+a.Key] = a.Value.Resolve().String()
		return true
	})
	s := r.store
	s.mu.Lock()
	s.lines = append(s.lines, line)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (r *LogRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append([]slog.Attr(nil), r.attrs...)
	for _, a := range attrs {
		c.attrs = append(c.attrs, slog.Attr{Key: r.group + a.Key, Value: a.Value})
	}
	return &c
}

// WithGroup implements slog.Handler; group names prefix the keys.
func (r *LogRecorder) WithGroup(name string) slog.Handler {
	c := *r
	c.group = r.group + name + "."
	return &c
}

// Lines returns the lines kept so far.
func (r *LogRecorder) Lines() []LogLine {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	return append([]LogLine(nil), r.store.lines...)
}

// Wait returns the first line for which match is true, waiting for it
// until ctx is done.
func (r *LogRecorder) Wait(ctx context.Context, match func(LogLine) bool) (LogLine, error) {
	seen := 0
	for {
		s := r.store
		s.mu.Lock()
		lines, changed := append([]LogLine(nil), s.lines[seen:]...), s.changed
		seen = len(s.lines)
		s.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return LogLine{}, ctx.Err()
		case <-changed:
		}
	}
}
