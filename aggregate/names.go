package aggregate

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"
)

// maxIdentLen is the longest identifier PostgreSQL keeps, in bytes
// (NAMEDATALEN-1). It truncates longer ones without an error.
const maxIdentLen = 63

// derivedHashLen is the number of hex digits of the hash in a shortened
// derived name.
const derivedHashLen = 8

// derivedName is the name of an object derived from the configured name
// base by appending suffix (non-empty): the aggregate table's shadow
// table (suffix "__shadow") and its partition column's index ("_" and
// the column). Every identifier this package derives from a configured
// name is made here.
//
// When base+suffix fits in maxIdentLen bytes, it is the name: existing
// objects (daily_sales__shadow, daily_sales_sale_date) keep their names.
// A longer name would be truncated by PostgreSQL, and could then be base
// itself (the shadow table of a 63-byte table is that table) or the name
// derived from another base with the same first bytes. It is shortened
// instead to exactly maxIdentLen bytes,
//
//	left(base, n) + "_" + hex(sha256(base + suffix))[:8] + left(suffix, m)
//
// keeping all of the suffix when it is short (m = len(suffix) up to 27
// bytes, half of the 54 left beside the hash, or more when base is
// shorter than that) and filling the rest with the start of base. Two
// names that differ anywhere, even past the bytes kept, get different
// hashes; distinct inputs collide only if 32-bit hashes do. Should the
// result be base itself, which takes a base built to contain its own
// hash, the hash is taken again with a zero byte appended: the result is
// never base. The rule must stay as it is: objects created under these
// names are found again by them.
func derivedName(base, suffix string) string {
	full := base + suffix
	if len(full) <= maxIdentLen {
		return full
	}
	room := maxIdentLen - 1 - derivedHashLen
	m := min(len(suffix), max(room/2, room-len(base)))
	n := room - m
	for salt := ""; ; salt += "\x00" {
		sum := sha256.Sum256([]byte(full + salt))
		name := cut(base, n) + "_" + hex.EncodeToString(sum[:derivedHashLen/2]) + cut(suffix, m)
		if name != base {
			return name
		}
	}
}

// cut returns the first n bytes of s, fewer if byte n would split a
// UTF-8 sequence.
func cut(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
