package cdc

import (
	"encoding/binary"
	"fmt"
)

// changeMessage is an insert, update or delete message of pgoutput
// (protocol version 2), its tuples not yet decoded: each is the bytes of a
// TupleData, from its column count on, or nil when the message has none.
// They point into the message, which the connection reuses: decodeTuple
// copies what it keeps.
type changeMessage struct {
	op         string
	xid, rel   uint32
	newT, oldT []byte
}

// parseChange reads an insert ('I'), update ('U') or delete ('D') message
// as pgoutput sends it: the transaction's xid inside a streamed
// transaction, the relation, then 'N' and the new tuple (insert), an
// optional 'K' or 'O' and the old key or row, then 'N' and the new tuple
// (update), or 'K' or 'O' and the old key or row (delete). It checks every
// length against the message and copies nothing; these messages are
// nearly all a busy stream carries.
func parseChange(data []byte, inStream bool) (changeMessage, error) {
	var m changeMessage
	malformed := func(what string) (changeMessage, error) {
		return changeMessage{}, fmt.Errorf("%w: type %q, %d bytes: %s", errMalformed, data[0], len(data), what)
	}
	switch data[0] {
	case 'I':
		m.op = opInsert
	case 'U':
		m.op = opUpdate
	case 'D':
		m.op = opDelete
	default:
		return malformed("not an insert, update or delete")
	}
	p := data[1:]
	if inStream {
		if len(p) < 4 {
			return malformed("no xid")
		}
		m.xid, p = binary.BigEndian.Uint32(p), p[4:]
	}
	if len(p) < 5 {
		return malformed("no relation and tuple")
	}
	m.rel, p = binary.BigEndian.Uint32(p), p[4:]
	// tuple reads the tuple after the tag byte p[0].
	tuple := func() ([]byte, error) {
		n, err := tupleLen(p[1:])
		if err != nil {
			return nil, err
		}
		t := p[1 : 1+n]
		p = p[1+n:]
		return t, nil
	}
	var err error
	if p[0] == 'K' || p[0] == 'O' {
		if m.op == opInsert {
			return malformed("an insert with an old tuple")
		}
		if m.oldT, err = tuple(); err != nil {
			return malformed(err.Error())
		}
		if m.op == opDelete {
			return m, nil
		}
		if len(p) == 0 {
			return malformed("an update without its new tuple")
		}
	} else if m.op == opDelete {
		return malformed(fmt.Sprintf("a delete's tuple tagged %q, not K or O", p[0]))
	}
	if p[0] != 'N' {
		return malformed(fmt.Sprintf("a new tuple tagged %q, not N", p[0]))
	}
	if m.newT, err = tuple(); err != nil {
		return malformed(err.Error())
	}
	return m, nil
}

// tupleLen returns the length of the TupleData at the start of p: a
// column count, then per column its kind, n (NULL) or u (unchanged TOAST)
// alone, t (text) or b (binary) with a length and that many bytes.
func tupleLen(p []byte) (int, error) {
	if len(p) < 2 {
		return 0, fmt.Errorf("a tuple of %d bytes", len(p))
	}
	cols := int(binary.BigEndian.Uint16(p))
	off := 2
	for i := range cols {
		if off >= len(p) {
			return 0, fmt.Errorf("column %d of %d past the end", i+1, cols)
		}
		kind := p[off]
		off++
		switch kind {
		case 'n', 'u':
		case 't', 'b':
			if len(p)-off < 4 {
				return 0, fmt.Errorf("column %d of %d: no length", i+1, cols)
			}
			l := uint64(binary.BigEndian.Uint32(p[off:]))
			off += 4
			if l > uint64(len(p)-off) {
				return 0, fmt.Errorf("column %d of %d: %d bytes, %d left", i+1, cols, l, len(p)-off)
			}
			off += int(l)
		default:
			return 0, fmt.Errorf("column %d of %d of kind %q", i+1, cols, kind)
		}
	}
	return off, nil
}
