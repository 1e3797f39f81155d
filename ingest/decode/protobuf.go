package decode

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// protoCodec decodes the messages of one compiled .proto file. It holds no
// state between calls: toJSON is safe for concurrent use.
type protoCodec struct {
	file protoreflect.FileDescriptor
	// types are the messages of the file and of everything it imports, by
	// full name: what an Any may hold.
	types map[protoreflect.FullName]protoreflect.MessageDescriptor
}

// protoMainFile is the path the schema itself compiles under; references
// are compiled under their import paths.
const protoMainFile = "schema.proto"

// compileProtobuf compiles schema, the text of a .proto file as the
// Schema Registry stores it, with refs, the files it imports by import
// path. The standard imports (google/protobuf/*.proto) always resolve to
// the descriptors built into the binary, also when refs carry a copy.
func compileProtobuf(schema string, refs []schemaRef) (codec, error) {
	files := make(map[string]string, len(refs)+1)
	for _, r := range refs {
		if prev, ok := files[r.Name]; ok && prev != r.Schema {
			return nil, fmt.Errorf("reference %q is listed twice with different texts", r.Name)
		}
		files[r.Name] = r.Schema
	}
	main := protoMainFile
	for i := 0; ; i++ {
		if _, taken := files[main]; !taken {
			break
		}
		main = "schema_" + strconv.Itoa(i) + ".proto"
	}
	files[main] = schema

	// Standard imports first, so that a reference cannot redefine a
	// well-known type; then the schema and its references; nothing else
	// (no file system).
	standard := protocompile.WithStandardImports(protocompile.ResolverFunc(func(string) (protocompile.SearchResult, error) {
		return protocompile.SearchResult{}, os.ErrNotExist
	}))
	c := protocompile.Compiler{
		Resolver: protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
			if r, err := standard.FindFileByPath(path); err == nil {
				return r, nil
			}
			if src, ok := files[path]; ok {
				return protocompile.SearchResult{Source: strings.NewReader(src)}, nil
			}
			return protocompile.SearchResult{}, fmt.Errorf("%q is neither a reference nor a standard import", path)
		}),
		MaxParallelism: 1,
	}
	compiled, err := c.Compile(context.Background(), main)
	if err != nil {
		return nil, fmt.Errorf("protobuf schema: %w", err)
	}
	fd := compiled[0]
	if fd.Messages().Len() == 0 {
		return nil, errors.New("protobuf schema defines no message")
	}
	pc := &protoCodec{file: fd, types: map[protoreflect.FullName]protoreflect.MessageDescriptor{}}
	pc.index(fd, map[string]bool{})
	return pc, nil
}

// index adds the messages of fd and its imports to c.types.
func (c *protoCodec) index(fd protoreflect.FileDescriptor, seen map[string]bool) {
	if seen[fd.Path()] {
		return
	}
	seen[fd.Path()] = true
	var add func(protoreflect.MessageDescriptors)
	add = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			c.types[md.FullName()] = md
			add(md.Messages())
		}
	}
	add(fd.Messages())
	imports := fd.Imports()
	for i := range imports.Len() {
		c.index(imports.Get(i).FileDescriptor, seen)
	}
}

// toJSON reads the message indexes, decodes the message they name and
// writes it as JSON, within the budget b.
func (c *protoCodec) toJSON(payload []byte, b *budget) ([]byte, error) {
	md, msgBytes, err := c.messageAt(payload)
	if err != nil {
		return nil, err
	}
	m, err := unmarshalProto(md, msgBytes, 0)
	if err != nil {
		return nil, err
	}
	w := protoWriter{types: c.types, buf: make([]byte, 0, min(2*len(msgBytes)+64, b.limit)), bud: b}
	if err := w.message(m); err != nil {
		return nil, err
	}
	if err := b.spend(len(w.buf)); err != nil {
		return nil, err
	}
	return w.buf, nil
}

// unmarshalProto decodes b as a message of type md, nested in depth
// levels of JSON. Fields the descriptor does not know (written by a newer
// or older schema) are kept aside by the decoder and never written out.
//
// The decoder panics on some malformed map entries (a key field repeated
// with another wire type, google.golang.org/protobuf v1.36.12); the bytes
// are untrusted, so a panic in it is a malformed message.
func unmarshalProto(md protoreflect.MessageDescriptor, b []byte, depth int) (_ protoreflect.Message, err error) {
	// Each message level is at least one level of JSON nesting, so a
	// message nested deeper than maxDepth is refused before it is
	// decoded; so are unknown groups nested as deep, which the decoder
	// would skip up to its own limit of 10000 levels.
	if err := protoDepth(md, b, depth); err != nil {
		return nil, fmt.Errorf("%s: %w", md.FullName(), err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: malformed message (the decoder failed: %v)", md.FullName(), r)
		}
	}()
	m := dynamicpb.NewMessage(md)
	opts := proto.UnmarshalOptions{RecursionLimit: maxDepth + 1}
	if err := opts.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", md.FullName(), err)
	}
	return m, nil
}

// protoDepth checks that b, a message of type md at depth levels, nests
// no message, map entry or group (of a known field or not) maxDepth
// levels deep or more; it recurses as deep as the messages it accepts,
// and reads unknown groups without recursion. Malformed bytes are left to
// the decoder, which says what is wrong with them.
func protoDepth(md protoreflect.MessageDescriptor, b []byte, depth int) error {
	if depth >= maxDepth {
		return errDepth()
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		fd := fields.ByNumber(num)
		var inner []byte // the bytes of a message or group of a known field
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			b = b[n:]
			if fd != nil && fd.Message() != nil && (fd.Kind() == protoreflect.MessageKind || fd.IsMap()) {
				inner = v
			}
		case protowire.StartGroupType:
			n, err := skipGroup(num, b, maxDepth-depth-1)
			if n < 0 || err != nil {
				return err
			}
			if fd != nil && fd.Kind() == protoreflect.GroupKind {
				inner = b[:n-protowire.SizeTag(num)]
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil
			}
			b = b[n:]
		}
		if inner != nil {
			if err := protoDepth(fd.Message(), inner, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// skipGroup returns the length of the group num that b begins with, its
// end tag included, or a negative length when b is malformed; more than
// levels groups open at once, this one included, are over the limit.
func skipGroup(num protowire.Number, b []byte, levels int) (int, error) {
	if levels < 1 {
		return 0, errDepth()
	}
	open := []protowire.Number{num}
	n0 := len(b)
	for len(open) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return n, nil
		}
		b = b[n:]
		switch typ {
		case protowire.StartGroupType:
			if len(open) >= levels {
				return 0, errDepth()
			}
			open = append(open, num)
		case protowire.EndGroupType:
			if num != open[len(open)-1] {
				return -1, nil
			}
			open = open[:len(open)-1]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return n, nil
			}
			b = b[n:]
		}
	}
	return n0 - len(b), nil
}

// messageAt reads the Confluent message indexes at the start of payload:
// a zigzag varint count, then that many zigzag varint indexes, the first
// into the file's top-level messages, each next one into the messages
// nested in the previous; a count of 0 stands for the single index 0. It
// returns the message type they name and the bytes after them. As in
// Confluent's own serializers, the indexes count the messages the .proto
// text declares: the entry types of map fields are not among them.
func (c *protoCodec) messageAt(payload []byte) (protoreflect.MessageDescriptor, []byte, error) {
	n, k := binary.Varint(payload)
	if k <= 0 {
		return nil, nil, errors.New("message indexes: missing or malformed count")
	}
	rest := payload[k:]
	msgs := c.file.Messages()
	if n == 0 {
		return msgs.Get(0), rest, nil // top-level messages are never map entries
	}
	// Every index takes at least one byte.
	if n < 0 || n > int64(len(rest)) {
		return nil, nil, fmt.Errorf("message indexes: count %d is out of range", n)
	}
	var md protoreflect.MessageDescriptor
	path := make([]int64, 0, min(n, 8))
	for range n {
		idx, k := binary.Varint(rest)
		if k <= 0 {
			return nil, nil, fmt.Errorf("message indexes: malformed index after %v", path)
		}
		rest = rest[k:]
		path = append(path, idx)
		md = declaredMessage(msgs, idx)
		if md == nil {
			return nil, nil, fmt.Errorf("message indexes %v: no message at index %d (%d there)", path, idx, countDeclared(msgs))
		}
		msgs = md.Messages()
	}
	return md, rest, nil
}

// declaredMessage returns the message at idx among msgs leaving out map
// entries, nil when there is none.
func declaredMessage(msgs protoreflect.MessageDescriptors, idx int64) protoreflect.MessageDescriptor {
	if idx < 0 {
		return nil
	}
	for i := range msgs.Len() {
		md := msgs.Get(i)
		if md.IsMapEntry() {
			continue
		}
		if idx == 0 {
			return md
		}
		idx--
	}
	return nil
}

func countDeclared(msgs protoreflect.MessageDescriptors) int {
	n := 0
	for i := range msgs.Len() {
		if !msgs.Get(i).IsMapEntry() {
			n++
		}
	}
	return n
}

// protoWriter appends a message to buf as JSON, following docs/formats.md:
// every field under its .proto name, in declaration order, within the
// record's budget bud. Every field and item writes a few bytes before the
// next check of the budget, but for a string or bytes field, whose
// content is the record's own bytes.
type protoWriter struct {
	types map[protoreflect.FullName]protoreflect.MessageDescriptor
	buf   []byte
	depth int
	bud   *budget
}

// within checks that the JSON written so far is within the budget, and
// makes room for the next field or item.
func (w *protoWriter) within() error {
	if !w.bud.fits(len(w.buf), 0) {
		return w.bud.overBytes()
	}
	w.buf = w.bud.grow(w.buf, 256)
	return nil
}

// protoPathError is an error inside a message, with the path of the
// field it happened at.
type protoPathError struct {
	path []string // from the outermost field in
	err  error
}

func (e *protoPathError) Error() string {
	return "at " + strings.TrimPrefix(strings.Join(e.path, ""), ".") + ": " + e.err.Error()
}

func (e *protoPathError) Unwrap() error { return e.err }

// atPath prefixes err's path with seg (".name", "[3]", `["key"]`).
func atPath(err error, seg string) error {
	var pe *protoPathError
	if errors.As(err, &pe) {
		pe.path = slices.Insert(pe.path, 0, seg)
		return pe
	}
	return &protoPathError{path: []string{seg}, err: err}
}

func (w *protoWriter) open(c byte) error {
	w.depth++
	if w.depth > maxDepth {
		return errDepth()
	}
	w.buf = append(w.buf, c)
	return nil
}

func (w *protoWriter) close(c byte) {
	w.depth--
	w.buf = append(w.buf, c)
}

// message writes m: a well-known type as its JSON form, any other message
// as an object.
func (w *protoWriter) message(m protoreflect.Message) error {
	if write := wellKnown(m.Descriptor()); write != nil {
		return write(w, m)
	}
	return w.object(m, "")
}

// object writes every field of m; typeURL, when not empty, comes first as
// "@type" (an Any's content).
func (w *protoWriter) object(m protoreflect.Message, typeURL string) error {
	if err := w.open('{'); err != nil {
		return err
	}
	if typeURL != "" {
		w.buf = append(w.buf, `"@type":`...)
		if err := w.string(typeURL); err != nil {
			return err
		}
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if i > 0 || typeURL != "" {
			w.buf = append(w.buf, ',')
		}
		if err := w.within(); err != nil {
			return err
		}
		w.buf = strconv.AppendQuote(w.buf, string(fd.Name())) // identifiers: ASCII letters, digits, _
		w.buf = append(w.buf, ':')
		if err := w.field(m, fd); err != nil {
			return atPath(err, "."+string(fd.Name()))
		}
	}
	w.close('}')
	return nil
}

// field writes the value of fd in m: repeated fields as arrays, maps as
// objects, a field with presence (message fields, oneof members, proto3
// optional, proto2 optional) that is not set as null, any other field as
// its value, the zero value when unset.
func (w *protoWriter) field(m protoreflect.Message, fd protoreflect.FieldDescriptor) error {
	switch {
	case fd.IsList():
		list := m.Get(fd).List()
		if err := w.bud.takeItems(int64(list.Len())); err != nil {
			return err
		}
		if err := w.open('['); err != nil {
			return err
		}
		for i := range list.Len() {
			if i > 0 {
				w.buf = append(w.buf, ',')
			}
			if err := w.within(); err != nil {
				return err
			}
			if err := w.single(fd, list.Get(i)); err != nil {
				return atPath(err, "["+strconv.Itoa(i)+"]")
			}
		}
		w.close(']')
		return nil
	case fd.IsMap():
		return w.mapField(m.Get(fd).Map(), fd)
	case fd.HasPresence() && !m.Has(fd):
		w.buf = append(w.buf, "null"...)
		return nil
	default:
		return w.single(fd, m.Get(fd))
	}
}

// mapField writes a map as an object, keys in their string order.
func (w *protoWriter) mapField(mp protoreflect.Map, fd protoreflect.FieldDescriptor) error {
	type entry struct {
		key string
		val protoreflect.Value
	}
	if err := w.bud.takeItems(int64(mp.Len())); err != nil {
		return err
	}
	entries := make([]entry, 0, mp.Len())
	keyKind := fd.MapKey().Kind()
	mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		var s string
		switch keyKind {
		case protoreflect.StringKind:
			s = k.String()
		case protoreflect.BoolKind:
			s = strconv.FormatBool(k.Bool())
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			s = strconv.FormatUint(k.Uint(), 10)
		default: // the signed integer kinds
			s = strconv.FormatInt(k.Int(), 10)
		}
		entries = append(entries, entry{s, v})
		return true
	})
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	if err := w.open('{'); err != nil {
		return err
	}
	for i, e := range entries {
		if i > 0 {
			w.buf = append(w.buf, ',')
		}
		if err := w.within(); err != nil {
			return err
		}
		if err := w.string(e.key); err != nil {
			return atPath(err, "[key]")
		}
		w.buf = append(w.buf, ':')
		if err := w.single(fd.MapValue(), e.val); err != nil {
			return atPath(err, "["+strconv.Quote(e.key)+"]")
		}
	}
	w.close('}')
	return nil
}

// single writes one value of fd's type.
func (w *protoWriter) single(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		w.buf = strconv.AppendBool(w.buf, v.Bool())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		w.buf = strconv.AppendInt(w.buf, v.Int(), 10)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		w.buf = strconv.AppendUint(w.buf, v.Uint(), 10)
	case protoreflect.FloatKind:
		w.float(v.Float(), 32)
	case protoreflect.DoubleKind:
		w.float(v.Float(), 64)
	case protoreflect.StringKind:
		return w.string(v.String())
	case protoreflect.BytesKind:
		w.buf = append(w.buf, '"')
		w.buf = base64.StdEncoding.AppendEncode(w.buf, v.Bytes())
		w.buf = append(w.buf, '"')
	case protoreflect.EnumKind:
		w.enum(fd.Enum(), v.Enum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return w.message(v.Message())
	default:
		return fmt.Errorf("unsupported field kind %s", fd.Kind())
	}
	return nil
}

// enum writes an enum value by name, a number the enum does not declare
// as the number, and google.protobuf.NullValue as null.
func (w *protoWriter) enum(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) {
	if ed.FullName() == "google.protobuf.NullValue" {
		w.buf = append(w.buf, "null"...)
		return
	}
	if ev := ed.Values().ByNumber(n); ev != nil {
		w.buf = strconv.AppendQuote(w.buf, string(ev.Name())) // identifiers: ASCII
		return
	}
	w.buf = strconv.AppendInt(w.buf, int64(n), 10)
}

// float writes f as the shortest JSON number that reads back as the same
// float of that size; NaN and the infinities as strings.
func (w *protoWriter) float(f float64, bits int) {
	switch {
	case math.IsNaN(f):
		w.buf = append(w.buf, `"NaN"`...)
		return
	case math.IsInf(f, 1):
		w.buf = append(w.buf, `"Infinity"`...)
		return
	case math.IsInf(f, -1):
		w.buf = append(w.buf, `"-Infinity"`...)
		return
	}
	// As encoding/json writes floats: plain notation for ordinary
	// magnitudes, an exponent for very small and very large ones.
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	w.buf = strconv.AppendFloat(w.buf, f, format, -1, bits)
}

// string writes s as a JSON string. Text jsonb cannot hold (invalid UTF-8,
// the NUL character) is an error.
func (w *protoWriter) string(s string) error {
	buf, err := pgjson.AppendText(w.buf, s)
	switch {
	case errors.Is(err, pgjson.ErrInvalidUTF8):
		return errors.New("string is not valid UTF-8")
	case err != nil:
		return errors.New("string holds " + err.Error())
	}
	w.buf = buf
	return nil
}

// wellKnownFiles maps the well-known types to the standard file that
// declares them; a message of that name from another file is an ordinary
// message.
var wellKnownFiles = map[protoreflect.FullName]string{
	"google.protobuf.Timestamp":   "google/protobuf/timestamp.proto",
	"google.protobuf.Duration":    "google/protobuf/duration.proto",
	"google.protobuf.FieldMask":   "google/protobuf/field_mask.proto",
	"google.protobuf.Any":         "google/protobuf/any.proto",
	"google.protobuf.Struct":      "google/protobuf/struct.proto",
	"google.protobuf.Value":       "google/protobuf/struct.proto",
	"google.protobuf.ListValue":   "google/protobuf/struct.proto",
	"google.protobuf.DoubleValue": "google/protobuf/wrappers.proto",
	"google.protobuf.FloatValue":  "google/protobuf/wrappers.proto",
	"google.protobuf.Int64Value":  "google/protobuf/wrappers.proto",
	"google.protobuf.UInt64Value": "google/protobuf/wrappers.proto",
	"google.protobuf.Int32Value":  "google/protobuf/wrappers.proto",
	"google.protobuf.UInt32Value": "google/protobuf/wrappers.proto",
	"google.protobuf.BoolValue":   "google/protobuf/wrappers.proto",
	"google.protobuf.StringValue": "google/protobuf/wrappers.proto",
	"google.protobuf.BytesValue":  "google/protobuf/wrappers.proto",
}

// wellKnown returns the writer of a well-known type, nil for any other
// message (google.protobuf.Empty included: it is an object without
// fields, {}). The standard files always come from the binary (see
// compileProtobuf), so the fields the writers read are there.
func wellKnown(md protoreflect.MessageDescriptor) func(*protoWriter, protoreflect.Message) error {
	file, ok := wellKnownFiles[md.FullName()]
	if !ok || md.ParentFile().Path() != file {
		return nil
	}
	switch md.Name() {
	case "Timestamp":
		return (*protoWriter).timestamp
	case "Duration", "FieldMask":
		return (*protoWriter).protojson
	case "Any":
		return (*protoWriter).any
	case "Struct":
		return func(w *protoWriter, m protoreflect.Message) error {
			return w.mapField(m.Get(md.Fields().ByName("fields")).Map(), md.Fields().ByName("fields"))
		}
	case "ListValue":
		return func(w *protoWriter, m protoreflect.Message) error {
			return w.field(m, md.Fields().ByName("values"))
		}
	case "Value":
		return (*protoWriter).value
	default: // the wrappers
		return func(w *protoWriter, m protoreflect.Message) error {
			fd := md.Fields().ByName("value")
			return w.single(fd, m.Get(fd))
		}
	}
}

// Timestamps as RFC 3339 allows them: years 1 to 9999.
const (
	minTimestampSeconds = -62135596800
	maxTimestampSeconds = 253402300799
)

// timestamp writes a google.protobuf.Timestamp as RFC 3339 in UTC,
// fractional zeros trimmed.
func (w *protoWriter) timestamp(m protoreflect.Message) error {
	fds := m.Descriptor().Fields()
	secs, nanos := m.Get(fds.ByName("seconds")).Int(), m.Get(fds.ByName("nanos")).Int()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return fmt.Errorf("google.protobuf.Timestamp: seconds %d outside the years 1 to 9999", secs)
	}
	if nanos < 0 || nanos > 999_999_999 {
		return fmt.Errorf("google.protobuf.Timestamp: nanos %d outside 0 to 999999999", nanos)
	}
	w.buf = append(w.buf, '"')
	w.buf = time.Unix(secs, nanos).UTC().AppendFormat(w.buf, time.RFC3339Nano)
	w.buf = append(w.buf, '"')
	return nil
}

// protojson writes m as protojson does (Duration, FieldMask: one string).
func (w *protoWriter) protojson(m protoreflect.Message) error {
	b, err := protojson.Marshal(m.Interface())
	if err != nil {
		return err
	}
	w.buf = append(w.buf, b...)
	return nil
}

// value writes a google.protobuf.Value as the JSON it holds; a Value with
// no kind set as null.
func (w *protoWriter) value(m protoreflect.Message) error {
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("kind"))
	if fd == nil {
		w.buf = append(w.buf, "null"...)
		return nil
	}
	return w.single(fd, m.Get(fd))
}

// any writes a google.protobuf.Any as protojson shapes it: the content's
// fields with "@type" first, or {"@type": ..., "value": ...} when the
// content is itself a well-known type; an empty Any as {}. The content is
// mapped like any other message. A type that is neither in the schema,
// its references nor the standard imports is an error.
func (w *protoWriter) any(m protoreflect.Message) error {
	fds := m.Descriptor().Fields()
	typeURL, value := m.Get(fds.ByName("type_url")).String(), m.Get(fds.ByName("value")).Bytes()
	if typeURL == "" && len(value) == 0 {
		w.buf = append(w.buf, "{}"...)
		return nil
	}
	name := protoreflect.FullName(typeURL[strings.LastIndexByte(typeURL, '/')+1:])
	md := w.types[name]
	if md == nil && wellKnownFiles[name] != "" {
		if d, err := protoregistry.GlobalFiles.FindDescriptorByName(name); err == nil {
			md, _ = d.(protoreflect.MessageDescriptor)
		}
	}
	if md == nil {
		return fmt.Errorf("google.protobuf.Any: type %q is not in the schema or its references", typeURL)
	}
	// The content was decoded as bytes with the message around it and
	// is decoded again now, as deep as it is nested: Anys within Anys
	// would cost their depth times the record's size.
	if err := w.bud.takeWork(len(value), "google.protobuf.Any "+string(name)); err != nil {
		return err
	}
	inner, err := unmarshalProto(md, value, w.depth)
	if err != nil {
		return fmt.Errorf("google.protobuf.Any: %w", err)
	}
	write := wellKnown(md)
	if write == nil {
		return w.object(inner, typeURL)
	}
	if err := w.open('{'); err != nil {
		return err
	}
	w.buf = append(w.buf, `"@type":`...)
	if err := w.string(typeURL); err != nil {
		return err
	}
	w.buf = append(w.buf, `,"value":`...)
	if err := write(w, inner); err != nil {
		return err
	}
	w.close('}')
	return nil
}
