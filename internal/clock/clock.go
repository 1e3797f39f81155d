// Package clock provides a service clock that tests and the demo set by
// hand, so that time-dependent behaviour never depends on today's date.
package clock

import (
	"sync"
	"time"
)

// Settable is a clock that stands still until Set; safe for concurrent use.
type Settable struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock set to t.
func New(t time.Time) *Settable { return &Settable{t: t} }

// Now returns the time last set.
func (c *Settable) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Settable) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
