package decode

import (
	"bytes"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// A document of the JSON converter with schemas.enable is an object of
// two members, schema and payload, written compactly: the schema first
// as the converter writes it ({"schema":S,"payload":P}), or after the
// payload as a writer that sorts the members does
// ({"payload":P,"schema":S}). Most records of a topic carry the same
// schema S: when a document is made of the schema of the last document of
// its kind that was checked and read, byte for byte, and of a payload P,
// only P needs checking (the whole is then a document pgjson.Scan takes)
// and S's parse is at hand.

// Members of a compact document of the JSON converter.
const (
	schemaFirst   = `{"schema":`
	payloadAfter  = `,"payload":`
	payloadFirst  = `{"payload":`
	schemaAfter   = `,"schema":`
	compactLayout = len(schemaFirst) + len(payloadAfter) // the bytes of either layout around S and P, but for the closing brace
)

// jsonSpace is JSON's white space.
const jsonSpace = " \t\n\r"

// recentSchema is the schema, as text and parsed, of the last document of
// a kind (key or value) that was checked and read.
type recentSchema struct {
	text   []byte
	schema *connectSchema
}

// remember notes schema s, of text raw, as that of doc, a document of the
// JSON converter of slot's kind that pgjson.Scan took and unwrap read.
// Only the schema of a compact document, in either layout, is noted.
func (c *schemaCache) remember(slot int, doc, raw []byte, s *connectSchema) {
	if len(raw) > maxCachedSchema {
		return
	}
	schemaAt := len(schemaFirst)
	if !bytes.HasPrefix(doc, []byte(schemaFirst)) {
		// {"payload":P,"schema":S}: S ends the document.
		end := bytes.LastIndexByte(doc, '}')
		schemaAt = end - len(raw)
		if !bytes.HasPrefix(doc, []byte(payloadFirst)) || schemaAt < len(payloadFirst) {
			return
		}
	}
	if !bytes.Equal(doc[schemaAt:min(len(doc), schemaAt+len(raw))], raw) {
		return
	}
	if r := c.recent[slot].Load(); r != nil && bytes.Equal(r.text, raw) {
		return
	}
	c.recent[slot].Store(&recentSchema{text: bytes.Clone(raw), schema: s})
}

// known returns the payload and schema of doc, a document of slot's kind,
// when it is the slot's recent schema and a payload in either compact
// layout, and the payload is a JSON value that pgjson.Scan takes in that
// place. Otherwise it returns a nil schema: doc is to be checked and read
// in full.
func (c *schemaCache) known(slot int, doc []byte) ([]byte, *connectSchema) {
	r := c.recent[slot].Load()
	doc = bytes.TrimRight(doc, jsonSpace)
	if r == nil || len(doc) < compactLayout+len(r.text)+1 || doc[len(doc)-1] != '}' {
		return nil, nil
	}
	var payload []byte
	switch {
	case bytes.HasPrefix(doc, []byte(schemaFirst)):
		rest := doc[len(schemaFirst) : len(doc)-1]
		if !bytes.HasPrefix(rest, r.text) || !bytes.HasPrefix(rest[len(r.text):], []byte(payloadAfter)) {
			return nil, nil
		}
		payload = rest[len(r.text)+len(payloadAfter):]
	case bytes.HasPrefix(doc, []byte(payloadFirst)):
		rest := doc[len(payloadFirst) : len(doc)-1]
		at := len(rest) - len(r.text) - len(schemaAfter)
		if !bytes.Equal(rest[at+len(schemaAfter):], r.text) || !bytes.Equal(rest[at:at+len(schemaAfter)], []byte(schemaAfter)) {
			return nil, nil
		}
		payload = rest[:at]
	default:
		return nil, nil
	}
	// JSON's white space only: bytes.TrimSpace would take a form feed
	// too, which JSON refuses.
	payload = bytes.Trim(payload, jsonSpace)
	if pgjson.ScanNested(payload, 1) != nil {
		return nil, nil
	}
	return payload, r.schema
}
