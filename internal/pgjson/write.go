package pgjson

import (
	"errors"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// ErrInvalidUTF8 and ErrNUL are AppendText's refusals: text that jsonb
// cannot store.
var (
	ErrInvalidUTF8 = errors.New("not valid UTF-8")
	ErrNUL         = errors.New("the character U+0000, which jsonb cannot store")
)

// AppendString appends s to b as a quoted JSON string. It escapes what
// JSON requires and nothing more (control characters, '"' and '\'), so
// that text passes through unchanged; each byte of s that is not valid
// UTF-8 becomes U+FFFD, as encoding/json writes it. U+0000 is written as
// \u0000, which jsonb refuses: callers that must not fail on it use
// AppendText.
func AppendString(b []byte, s string) []byte {
	b, _ = appendString(b, s, false)
	return b
}

// AppendText is AppendString for text that must reach jsonb as it is: it
// refuses invalid UTF-8 (ErrInvalidUTF8) and U+0000 (ErrNUL) instead of
// replacing or escaping them, in the same pass.
func AppendText(b []byte, s string) ([]byte, error) {
	return appendString(b, s, true)
}

func appendString(b []byte, s string, strict bool) ([]byte, error) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				if strict {
					return nil, ErrInvalidUTF8
				}
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				start = i + 1
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		if c == 0 && strict {
			return nil, ErrNUL
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"'), nil
}
