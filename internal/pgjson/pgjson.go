// Package pgjson tells which values of PostgreSQL's json type its jsonb
// type refuses, so that a json value can be embedded in a jsonb document
// only when the document will be taken.
//
// The json type checks only the syntax of its input. jsonb also refuses
// the escape \u0000 (text cannot hold it), a \u escape of a UTF-16
// surrogate that is not half of a pair, and numbers that numeric cannot
// hold: more than 131072 digits before the decimal point, more than 16383
// after it (counted as written: 1.50e-16382 has 16384), or an exponent of
// 2^30-1 or more in magnitude.
package pgjson

import (
	"encoding/json"
)

// numeric's limits, as PostgreSQL's numeric input checks them.
const (
	maxDscale   = 16383      // NUMERIC_DSCALE_MAX: digits after the decimal point
	maxWeight   = 32767      // NUMERIC_WEIGHT_MAX, in base-10000 digits
	minWeight   = -32768     // NUMERIC_WEIGHT_MIN
	maxExponent = 1073741823 // INT_MAX / 2: an exponent this large is refused outright
)

// JSONBTakes reports whether PostgreSQL's jsonb input takes s, which is
// the text of a json value. Text that is not JSON at all is refused too.
// It assumes a UTF-8 database.
func JSONBTakes(s string) bool {
	if !json.Valid([]byte(s)) {
		return false
	}
	for i := 0; i < len(s); {
		c := s[i]
		var ok bool
		switch {
		case c == '"':
			i, ok = stringTaken(s, i+1)
		case c == '-' || c >= '0' && c <= '9':
			i, ok = numberTaken(s, i)
		default:
			i, ok = i+1, true
		}
		if !ok {
			return false
		}
	}
	return true
}

// stringTaken checks the JSON string whose contents start at s[i] (after
// the opening quote) and returns the index after its closing quote.
func stringTaken(s string, i int) (int, bool) {
	for i < len(s) {
		switch s[i] {
		case '"':
			return i + 1, true
		case '\\':
			if s[i+1] != 'u' {
				i += 2
				continue
			}
			r := hex4(s[i+2 : i+6])
			i += 6
			switch {
			case r == 0:
				return i, false
			case r >= 0xdc00 && r <= 0xdfff:
				return i, false // a low surrogate without its high one
			case r >= 0xd800 && r <= 0xdbff:
				if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
					return i, false
				}
				if lo := hex4(s[i+2 : i+6]); lo < 0xdc00 || lo > 0xdfff {
					return i, false
				}
				i += 6
			}
		default:
			i++
		}
	}
	return i, false
}

// hex4 is the value of four hexadecimal digits (valid JSON has them).
func hex4(h string) rune {
	var r rune
	for i := 0; i < 4; i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// numberTaken checks the JSON number starting at s[i] as numeric's input
// would and returns the index after it.
func numberTaken(s string, i int) (int, bool) {
	if s[i] == '-' {
		i++
	}
	digits := func() (int, int) {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return start, i
	}
	intStart, intEnd := digits()
	fracStart, fracEnd := intEnd, intEnd
	if i < len(s) && s[i] == '.' {
		i++
		fracStart, fracEnd = digits()
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		neg := false
		if s[i] == '+' || s[i] == '-' {
			neg = s[i] == '-'
			i++
		}
		start, end := digits()
		for start < end && s[start] == '0' {
			start++
		}
		if end-start > 10 {
			return i, false
		}
		var e int64
		for _, d := range s[start:end] {
			e = e*10 + int64(d-'0')
		}
		if e >= maxExponent {
			return i, false
		}
		exp = int(e)
		if neg {
			exp = -exp
		}
	}
	if dscale := fracEnd - fracStart - exp; dscale > maxDscale {
		return i, false
	}
	// The decimal exponent of the first digit that is not zero gives the
	// weight; zero has weight 0 whatever its exponent.
	pos, found := 0, false
	for k := intStart; k < intEnd && !found; k++ {
		if s[k] != '0' {
			pos, found = intEnd-1-k, true
		}
	}
	for k := fracStart; k < fracEnd && !found; k++ {
		if s[k] != '0' {
			pos, found = -(k - fracStart + 1), true
		}
	}
	if !found {
		return i, true
	}
	pos += exp
	weight := pos / 4
	if pos < 0 && pos%4 != 0 {
		weight--
	}
	return i, weight >= minWeight && weight <= maxWeight
}
