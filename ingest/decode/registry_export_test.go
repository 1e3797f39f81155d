package decode

// The expiries of the answers that records of a schema id are dead
// letters, for the tests that move the cache clock past them.
const (
	UnknownTTL = unknownTTL
	InvalidTTL = invalidTTL
)
