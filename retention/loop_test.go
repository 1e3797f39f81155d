package retention_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/retention"
)

// TestLoop: inside `tidemark run` the pruner runs again every
// retention.every. While another process prunes it stands by, quietly; a
// run that fails is logged as an error, with the line the runbook names,
// and tried again at the next interval; once the cause is gone a run
// completes; and the loop returns nil when its context ends.
func TestLoop(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.salesUntilThe6th()
	w.clock.Set(at("2026-10-10 00:00"))
	w.reconcile(w.reconciler())
	w.cfg.Retention.Every = config.Duration(20 * time.Millisecond)
	release := w.holdPruneLock()
	var logs syncbuf.Buffer
	p, reg := w.pruner(func(o *retention.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	runs := func(result string) float64 {
		n, err := promreg.SumWhere(reg, "tidemark_prune_runs_total", "result", result)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Loop(ctx) }()

	waitfor.Until(t, "runs standing by beside another pruner", func() bool { return runs("busy") >= 2 })
	if text := logs.String(); !strings.Contains(text, `level=DEBUG msg="another process is pruning; standing by"`) ||
		strings.Contains(text, "level=ERROR") || strings.Contains(text, "level=WARN") {
		t.Errorf("standing by, the log says:\n%s", text)
	}

	// A table the runs prune is gone: each run fails.
	w.exec("ALTER TABLE tidemark.verify_runs RENAME TO verify_runs_away")
	release()
	waitfor.Until(t, "runs failing again and again", func() bool { return runs("error") >= 2 })
	if text := logs.String(); !strings.Contains(text, `level=WARN msg="retention run failed; trying again"`) ||
		!strings.Contains(text, "verify_runs") {
		t.Errorf("after failed runs, the log says:\n%s", text)
	}

	w.exec("ALTER TABLE tidemark.verify_runs_away RENAME TO verify_runs")
	waitfor.Until(t, "a run that completes", func() bool { return runs("ok") >= 1 })
	if raw := w.rows("SELECT count(*) FROM pg_inherits WHERE inhparent = 'raw.app_events'::regclass"); raw[0] != "0" {
		t.Errorf("raw partitions left: %s, want none", raw[0])
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Loop = %v after cancel, want nil", err)
		}
	case <-time.After(waitfor.Timeout):
		t.Fatalf("Loop did not end within %s of its context", waitfor.Timeout)
	}
}
