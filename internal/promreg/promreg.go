// Package promreg registers Prometheus collectors that several components
// of one process create alike (the pollers, key reconcilers and CDC
// readers of different sources share one registry).
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Shared registers c with reg, or returns the equal collector registered
// before. A registration that fails otherwise leaves c unregistered:
// metrics never stop a load.
func Shared[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

// Sum adds up the values of every series of the counter or gauge family
// called name that g gathers; 0 when there is none.
func Sum(g prometheus.Gatherer, name string) (float64, error) {
	families, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum, nil
}
