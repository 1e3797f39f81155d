// Package pgjson reads JSON as PostgreSQL's jsonb takes it: Scan checks a
// document in one pass and finds the values that JSON pointers name, and
// JSONBTakes says whether a value of the json type can be embedded in a
// jsonb document.
//
// The json type checks only the syntax of its input. jsonb also refuses
// the escape \u0000 (text cannot hold it), a \u escape of a UTF-16
// surrogate that is not half of a pair, and numbers that numeric cannot
// hold: more than 131072 digits before the decimal point, more than 16383
// after it (counted as written: 1.50e-16382 has 16384), or an exponent of
// 2^30-1 or more in magnitude. Both assume a UTF-8 database. PostgreSQL 16
// and later also take a zero with the exponent 2^30-1 (0e1073741823),
// which 14 and 15 refuse: the checks here refuse it on every version, so
// that a value is stored alike whatever the warehouse's version.
package pgjson

// numeric's limits, as PostgreSQL's numeric input checks them.
const (
	maxDscale   = 16383      // NUMERIC_DSCALE_MAX: digits after the decimal point
	maxWeight   = 32767      // NUMERIC_WEIGHT_MAX, in base-10000 digits
	minWeight   = -32768     // NUMERIC_WEIGHT_MIN
	maxExponent = 1073741823 // INT_MAX / 2: an exponent this large is refused outright
)

// JSONBTakes reports whether PostgreSQL's jsonb input takes s, which is
// the text of a json value. Text that is not JSON at all is refused too.
// Nesting is not bounded: a value the json type took was nested no deeper
// than jsonb takes.
func JSONBTakes(s string) bool {
	sc := scanner{b: []byte(s), maxDepth: -1}
	return sc.document(0) == nil
}
