// Package promreg registers Prometheus collectors that several components
// of one process create alike (the pollers, key reconcilers and CDC
// readers of different sources share one registry).
package promreg

import (
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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
func Sum(g prometheus.Gatherer, name string) (float64, error) { return SumWhere(g, name, "", "") }

// SumWhere is Sum over the series of name whose label has value (all of
// them when label is empty).
func SumWhere(g prometheus.Gatherer, name, label, value string) (float64, error) {
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
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == label && l.GetValue() == value
			}) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum, nil
}
