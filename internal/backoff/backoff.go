// Package backoff is the one retry delay of tidemark: exponential from a
// first delay up to a cap, with jitter, so that instances that failed
// together do not retry in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff counts the failures in a row of one retry loop and gives the
// delay before the next attempt. The zero value is not usable; set First
// and Max.
type Backoff struct {
	// First is the delay after the first failure; each further failure
	// doubles it, up to Max.
	First, Max time.Duration
	// Jitter is the share of each delay drawn at random (0 to 1): a
	// delay d becomes a value in [d - Jitter*d, d]. 0 means none.
	Jitter float64

	failures int
}

// Delay is the delay after the failures-th failure in a row (1 is the
// first): First doubled failures-1 times, at most Max, without jitter.
// Loops whose next attempt is stored rather than slept for use it.
func Delay(first, limit time.Duration, failures int) time.Duration {
	d := first
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Next records a failure and returns the delay before the next attempt.
func (b *Backoff) Next() time.Duration {
	b.failures++
	d := Delay(b.First, b.Max, b.failures)
	if b.Jitter > 0 {
		d -= time.Duration(rand.Float64() * b.Jitter * float64(d))
	}
	return d
}

// Reset forgets the failures: the next one waits First again.
func (b *Backoff) Reset() { b.failures = 0 }

// Failures is the number of failures in a row recorded since the last
// Reset.
func (b *Backoff) Failures() int { return b.failures }

// Wait records a failure and sleeps the delay Next gives, or until ctx
// ends; it returns ctx's error then.
func (b *Backoff) Wait(ctx context.Context) error {
	return Sleep(ctx, b.Next())
}

// Sleep waits d, or until ctx ends, and returns ctx's error then.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
