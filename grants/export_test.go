package grants

import (
	"testing"
	"time"
)

// SetSourceCheckTimeout sets the bound of one source's check for the rest
// of the test.
func SetSourceCheckTimeout(t testing.TB, d time.Duration) {
	t.Helper()
	old := sourceCheckTimeout
	sourceCheckTimeout = d
	t.Cleanup(func() { sourceCheckTimeout = old })
}
