package decode

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// jsonSchemaCodec validates values against one compiled JSON Schema. A
// compiled schema is safe for concurrent use, and so is toJSON.
type jsonSchemaCodec struct {
	schema *jsonschema.Schema
	base   string // the URL the schema compiled under, left out of error texts
}

// jsonSchemaBase is the URL the schema itself compiles under when it has
// no $id: relative references ("customer.json") resolve against it.
const jsonSchemaBase = "registry:///schema.json"

// englishPrinter writes the validator's messages.
var englishPrinter = message.NewPrinter(language.English)

// maxSchemaErrorLen bounds the text of a validation error.
const maxSchemaErrorLen = 400

// compileJSONSchema compiles schema given refs, the schemas it references
// by $ref URL. A schema without $schema is read as draft 2020-12. Formats
// are asserted as the schema's draft says: in drafts 4 to 7 they are
// assertions, from 2019-09 on annotations unless the meta-schema requires
// the format-assertion vocabulary. Nothing is ever fetched: a $ref that
// is neither the schema, one of refs nor a JSON Schema meta-schema is a
// compile error.
func compileJSONSchema(schema string, refs []schemaRef) (codec, error) {
	main, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("JSON schema is not JSON: %w", err)
	}
	docs := make([]any, len(refs))
	for i, r := range refs {
		if docs[i], err = jsonschema.UnmarshalJSON(strings.NewReader(r.Schema)); err != nil {
			return nil, fmt.Errorf("JSON schema reference %q is not JSON: %w", r.Name, err)
		}
	}
	base := jsonSchemaBase
	loader, err := newRefLoader(base, main, refs, docs)
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(loader)
	if err := c.AddResource(base, main); err != nil {
		return nil, fmt.Errorf("JSON schema: %w", err)
	}
	sch, err := c.Compile(base)
	if err != nil {
		return nil, compileError(err, base)
	}
	return &jsonSchemaCodec{schema: sch, base: base}, nil
}

// schemaError is an error of the validator rewritten to one short line.
type schemaError struct {
	msg string
	err error
}

func (e *schemaError) Error() string { return e.msg }
func (e *schemaError) Unwrap() error { return e.err }

// compileError says in one line why a schema does not compile: where a
// schema breaks its meta-schema, or the compiler's own message.
func compileError(err error, base string) error {
	var serr *jsonschema.SchemaValidationError
	var verr *jsonschema.ValidationError
	if errors.As(err, &serr) && errors.As(serr.Err, &verr) {
		name := "the schema"
		if u := strings.TrimSuffix(serr.URL, "#"); u != base {
			name = "reference " + u
		}
		msg := fmt.Sprintf("JSON schema: %s is not valid against its meta-schema: %s", name, describeFailures(verr, "", false))
		return &schemaError{truncateText(msg, maxSchemaErrorLen), err}
	}
	msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), base, "the schema")), " ")
	return &schemaError{truncateText("JSON schema: "+msg, maxSchemaErrorLen), err}
}

// refLoader finds the referenced schemas by URL and nothing else.
type refLoader map[string]any

// newRefLoader indexes each reference under every URL a $ref may name it
// by: its name as is when it is absolute, its name resolved against the
// schema's URL, against the schema's $id and against the $id of each
// reference, and its own $id. The first reference to claim a URL keeps it.
func newRefLoader(base string, main any, refs []schemaRef, docs []any) (refLoader, error) {
	baseURL, _ := url.Parse(base)
	bases := []*url.URL{baseURL}
	addBase := func(doc any) *url.URL {
		id, ok := topID(doc)
		if !ok {
			return nil
		}
		u, err := baseURL.Parse(id)
		if err != nil {
			return nil
		}
		u.Fragment = ""
		bases = append(bases, u)
		return u
	}
	addBase(main)
	l := refLoader{}
	for i := range refs {
		if u := addBase(docs[i]); u != nil {
			l.claim(u.String(), docs[i])
		}
	}
	for i, r := range refs {
		ref, err := url.Parse(r.Name)
		if err != nil || r.Name == "" {
			return nil, fmt.Errorf("JSON schema reference name %q is not a URL", r.Name)
		}
		for _, b := range bases {
			u := b.ResolveReference(ref)
			u.Fragment = ""
			l.claim(u.String(), docs[i])
		}
	}
	if _, ok := l[base]; ok {
		return nil, fmt.Errorf("a JSON schema reference resolves to the schema's own URL %s", base)
	}
	return l, nil
}

func (l refLoader) claim(u string, doc any) {
	if _, ok := l[u]; !ok {
		l[u] = doc
	}
}

// topID is the $id (or draft 4's id) at the top of a schema document.
func topID(doc any) (string, bool) {
	obj, ok := doc.(map[string]any)
	if !ok {
		return "", false
	}
	for _, k := range []string{"$id", "id"} {
		if s, ok := obj[k].(string); ok && s != "" {
			return s, true
		}
	}
	return "", false
}

// Load returns the referenced schema at u.
func (l refLoader) Load(u string) (any, error) {
	if doc, ok := l[u]; ok {
		return doc, nil
	}
	return nil, errors.New("not among the schema's references (nothing is fetched)")
}

// toJSON checks that payload is JSON that jsonb accepts and valid against
// the schema, within the budget b, and returns it unchanged.
func (c *jsonSchemaCodec) toJSON(payload []byte, b *budget) ([]byte, error) {
	if err := b.spend(len(payload)); err != nil {
		return nil, err
	}
	if err := jsonWork(payload, b); err != nil {
		return nil, err
	}
	if err := pgjson.Scan(payload, nil, nil); err != nil {
		return nil, err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err) // Scan took it; not expected
	}
	err = c.schema.Validate(v)
	var verr *jsonschema.ValidationError
	if errors.As(err, &verr) {
		msg := "JSON schema validation failed: " + describeFailures(verr, c.base, true)
		return nil, &schemaError{truncateText(msg, maxSchemaErrorLen), err}
	}
	if err != nil {
		return nil, err
	}
	return payload, nil
}

// jsonWork checks, before the validator reads doc, that doc nests no
// deeper than maxDepth and that its numbers cost no more than the work
// left in the budget b. The validator reads a number as an exact rational
// to compare it or to check that it is an integer (type, minimum,
// multipleOf, enum, uniqueItems), and that costs about the square of its
// digits and its exponent: 1e131071, eight bytes, allocates 350 KB. It
// reads nothing else of the document, whose errors Scan reports.
func jsonWork(doc []byte, b *budget) error {
	depth := 0
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '"':
			for i++; i < len(doc) && doc[i] != '"'; i++ {
				if doc[i] == '\\' {
					i++
				}
			}
		case c == '[' || c == '{':
			if depth++; depth > maxDepth {
				return errDepth()
			}
		case c == ']' || c == '}':
			depth--
		case c == '-' || c >= '0' && c <= '9':
			n, digits, exp := numberCost(doc[i:])
			cost := digits + digits*digits/512 + 4*exp
			if err := b.takeWork(cost, fmt.Sprintf("a number of %d digits and an exponent of %d", digits, exp)); err != nil {
				return err
			}
			i += n - 1
		}
	}
	return nil
}

// numberCost reads the JSON number that b begins with: its length, its
// digits, and the magnitude of its exponent, up to 1<<40.
func numberCost(b []byte) (n, digits, exp int) {
	if n < len(b) && b[n] == '-' {
		n++
	}
	for ; n < len(b) && (b[n] >= '0' && b[n] <= '9' || b[n] == '.'); n++ {
		if b[n] != '.' {
			digits++
		}
	}
	if n < len(b) && (b[n] == 'e' || b[n] == 'E') {
		n++
		if n < len(b) && (b[n] == '+' || b[n] == '-') {
			n++
		}
		for ; n < len(b) && b[n] >= '0' && b[n] <= '9'; n++ {
			exp = min(exp*10+int(b[n]-'0'), 1<<40)
		}
	}
	return max(n, 1), digits, exp
}

// describeFailures says where and why a value fails: the instance
// location, the message and, with keyword, the failing keyword's location
// in the schema, for the first few failures.
func describeFailures(verr *jsonschema.ValidationError, base string, keyword bool) string {
	var leaves []*jsonschema.ValidationError
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
		}
		for _, cause := range e.Causes {
			walk(cause)
		}
	}
	walk(verr)
	const shown = 3
	var sb strings.Builder
	for i, e := range leaves[:min(len(leaves), shown)] {
		if i > 0 {
			sb.WriteString("; ")
		}
		loc := "the document root"
		if len(e.InstanceLocation) > 0 {
			loc = jsonPointer(e.InstanceLocation)
		}
		fmt.Fprintf(&sb, "at %s: %s", loc, e.ErrorKind.LocalizedString(englishPrinter))
		if keyword {
			fmt.Fprintf(&sb, " [%s]", keywordLocation(e, base))
		}
	}
	if len(leaves) > shown {
		fmt.Fprintf(&sb, "; and %d more", len(leaves)-shown)
	}
	return sb.String()
}

// keywordLocation is where the failing keyword is in the schema:
// "#/properties/qty/minimum", prefixed with the referenced schema's URL
// when it is not the schema itself (whose URL is base).
func keywordLocation(e *jsonschema.ValidationError, base string) string {
	loc := strings.TrimPrefix(e.SchemaURL, base)
	if kw := e.ErrorKind.KeywordPath(); len(kw) > 0 {
		if !strings.Contains(loc, "#") {
			loc += "#"
		}
		loc = strings.TrimSuffix(loc, "/") + jsonPointer(kw)
	}
	return loc
}

// jsonPointer joins tokens into a JSON pointer.
func jsonPointer(tokens []string) string {
	var sb strings.Builder
	r := strings.NewReplacer("~", "~0", "/", "~1")
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(r.Replace(t))
	}
	return sb.String()
}

// truncateText cuts s to at most n bytes on a character boundary, marking
// the cut.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
