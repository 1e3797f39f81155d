package decode

import (
	"errors"
	"fmt"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// maxDepth bounds the nesting of the JSON that a record decodes to, as it
// does that of a JSON value (pgjson.MaxDepth): deeper is a decode_limit.
// It also bounds the decoders' recursion, so that no record can take the
// stack.
const maxDepth = pgjson.MaxDepth

// PostgreSQL's numeric, which a jsonb number is, holds at most this many
// digits before and after the decimal point.
const (
	maxNumericWeightDigits = 131072
	maxNumericScale        = 16383
)

// maxDecimalBytes bounds the unscaled value of a decimal, its
// sign-extension bytes left out: a two's-complement number of more bytes
// is at least 2^(8*61231-1), of more digits than the 131072+16383 a
// numeric holds. Converting it to digits would take time for nothing.
const maxDecimalBytes = 61231

// errLimit is what every error of a record over its budget wraps (or
// is, through an Is method): such a record is a ReasonDecodeLimit dead
// letter.
var errLimit = errors.New("over a decode limit")

// limitError is a record over its budget.
type limitError struct{ msg string }

func (e *limitError) Error() string        { return e.msg }
func (e *limitError) Is(target error) bool { return target == errLimit }

// budget is what decoding one record may cost, derived from the record's
// size: the JSON it decodes to, the items (array items, map entries) of
// that JSON, and the bytes decoded a second time (the content of a
// Protobuf Any, a JSON number's digits as the JSON Schema validator
// expands them). A decoder checks it before it builds anything large,
// so that a record over it is refused having cost about its budget.
type budget struct {
	limit int // JSON bytes allowed
	used  int // JSON bytes spent by earlier steps (a Debezium change's key, its row)
	items int // items left
	work  int // bytes left to decode a second time
	// derived is how limit was set, for errors: by the record's size
	// (its size and expansion), or else ingest.decode_max_bytes.
	derived         bool
	size, expansion int64
}

// why says how the budget's limit was set.
func (b *budget) why() string {
	if b.derived {
		return fmt.Sprintf("%d times the record's %d bytes plus %d: ingest.decode_max_expansion", b.expansion, b.size, config.DecodeSlack)
	}
	return "ingest.decode_max_bytes"
}

// newBudget is the budget of a record of size bytes under lim: at most
// lim.Expansion times its size plus config.DecodeSlack, at most
// lim.MaxBytes. Every item of the JSON takes two bytes of it at least (a
// value and a comma), so the items are half of it; and the work is as
// much as the JSON.
func newBudget(lim config.DecodeLimits, size int) *budget {
	// A source configuration that was not loaded (tests) carries none.
	maxBytes, expansion := lim.MaxBytes, lim.Expansion
	if maxBytes <= 0 {
		maxBytes = int64(config.DefaultDecodeMaxBytes)
	}
	if expansion <= 0 {
		expansion = config.DefaultDecodeMaxExpansion
	}
	b := &budget{size: int64(size), expansion: expansion}
	if derived := expansion*int64(size) + config.DecodeSlack; derived <= maxBytes {
		b.limit, b.derived = int(derived), true
	} else {
		b.limit = int(maxBytes)
	}
	b.items, b.work = b.limit/2, b.limit
	return b
}

// fits reports whether n more bytes of JSON, after out bytes written by
// the step under way, stay within the budget.
func (b *budget) fits(out, n int) bool { return b.used+out+n <= b.limit }

// overBytes is the error of a record whose JSON is over the budget.
func (b *budget) overBytes() error {
	return &limitError{fmt.Sprintf("the value decodes to more than its budget of %d bytes of JSON (%s)", b.limit, b.why())}
}

// takeItems spends n items, or says why there are not so many left.
func (b *budget) takeItems(n int64) error {
	if n > int64(b.items) {
		return &limitError{fmt.Sprintf("%d items: more than the %d its budget has left (half its %d bytes of JSON, %s)", n, b.items, b.limit, b.why())}
	}
	b.items -= int(n)
	return nil
}

// takeWork spends n bytes of decoding a second time; what says what.
func (b *budget) takeWork(n int, what string) error {
	if n > b.work {
		return &limitError{fmt.Sprintf("%s: more than the %d bytes its budget has left to decode again (%s)", what, b.work, b.why())}
	}
	b.work -= n
	return nil
}

// grow returns out, the JSON of the step under way, with room for n
// more bytes at least: its capacity doubled, up to the budget, so that
// JSON grown to its budget has cost about twice that in all (append
// grows large slices by a quarter, which would cost five times).
func (b *budget) grow(out []byte, n int) []byte {
	if cap(out)-len(out) >= n {
		return out
	}
	c := max(min(2*cap(out), b.limit-b.used+n), len(out)+n)
	grown := make([]byte, len(out), c)
	copy(grown, out)
	return grown
}

// spend records n bytes of JSON written by a step that is done.
func (b *budget) spend(n int) error {
	if !b.fits(0, n) {
		return b.overBytes()
	}
	b.used += n
	return nil
}

// errDepth is the error of a value nested deeper than maxDepth.
func errDepth() error {
	return &limitError{fmt.Sprintf("nested more than %d levels deep", maxDepth)}
}
