package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "test_total", Help: "A test counter."}
	first := Shared(reg, prometheus.NewCounterVec(opts, []string{"source"}))
	second := Shared(reg, prometheus.NewCounterVec(opts, []string{"source"}))
	if first != second {
		t.Fatal("the second registration did not return the first collector")
	}
	second.WithLabelValues("a").Inc()
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 1 || mfs[0].GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("gathered %v (%v), want one series at 1", mfs, err)
	}
}
