package decode

import (
	"runtime"
	"testing"

	"github.com/tidemark-dev/tidemark/config"
)

// toJSON decodes payload with c within the budget of a record of its
// size under the default limits.
func toJSON(c codec, payload []byte) ([]byte, error) {
	return c.toJSON(payload, newBudget(config.DecodeLimits{}, len(payload)))
}

// allocated is how many bytes f allocates (with whatever else runs
// meanwhile, which in a test is little).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// allocBound is the most that decoding a record whose budget allows
// limit bytes of JSON may allocate: a few times that, for the JSON grown
// by appends (up to twice its size, and the copies before), what the
// decoder builds besides and the error.
func allocBound(limit int) uint64 { return 8 * uint64(limit) }

// decodeBounded decodes payload with c under the budget of a record of its
// size (the defaults), failing t when decoding allocates more than
// allocBound allows, and returns what c returned.
func decodeBounded(t *testing.T, c codec, payload []byte) ([]byte, error) {
	t.Helper()
	b := newBudget(config.DecodeLimits{}, len(payload))
	var got []byte
	var err error
	if n := allocated(func() { got, err = c.toJSON(payload, b) }); n > allocBound(b.limit) {
		t.Fatalf("%d bytes allocated for %d bytes, more than %d", n, len(payload), allocBound(b.limit))
	}
	return got, err
}
