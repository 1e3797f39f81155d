package reconcile

import (
	"testing"
	"time"
)

// TestRetryBackoff: the delay after each failed rebuild in a row starts at
// reconcile.every, doubles, and stops growing at an hour (or at every, when
// that is longer).
func TestRetryBackoff(t *testing.T) {
	for _, tc := range []struct {
		every    time.Duration
		failures int
		want     time.Duration
	}{
		{time.Minute, 1, time.Minute},
		{time.Minute, 2, 2 * time.Minute},
		{time.Minute, 3, 4 * time.Minute},
		{time.Minute, 6, 32 * time.Minute},
		{time.Minute, 7, time.Hour},
		{time.Minute, 8, time.Hour},
		{time.Minute, 1000, time.Hour},
		{time.Second, 1, time.Second},
		{time.Second, 12, 2048 * time.Second},
		{time.Second, 13, time.Hour},
		{45 * time.Minute, 1, 45 * time.Minute},
		{45 * time.Minute, 2, time.Hour},
		{2 * time.Hour, 1, 2 * time.Hour},
		{2 * time.Hour, 5, 2 * time.Hour},
	} {
		if got := retryBackoff(tc.every, tc.failures); got != tc.want {
			t.Errorf("retryBackoff(%v, %d) = %v, want %v", tc.every, tc.failures, got, tc.want)
		}
	}
}
