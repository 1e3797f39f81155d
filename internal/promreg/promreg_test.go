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

func TestSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_total", Help: "A test counter."}, []string{"op"}))
	g := Shared(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_gauge", Help: "A test gauge."}))
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.Set(7)
	for name, want := range map[string]float64{"test_total": 5, "test_gauge": 7, "absent": 0} {
		if got, err := Sum(reg, name); err != nil || got != want {
			t.Errorf("Sum(%s) = %v (%v), want %v", name, got, err, want)
		}
	}
}
