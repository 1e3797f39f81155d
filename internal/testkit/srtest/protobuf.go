package srtest

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// ProtoFile is a .proto schema compiled as a producer's build compiles it,
// with the files it imports: what a producer builds its messages from.
type ProtoFile struct {
	protoreflect.FileDescriptor
	types *dynamicpb.Types // of the file and its imports, for Any
}

// CompileProto compiles schema, the text of a .proto file, with imports
// (import path to text) and the standard google/protobuf files.
func CompileProto(tb testing.TB, schema string, imports map[string]string) *ProtoFile {
	tb.Helper()
	const main = "producer/schema.proto"
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(protocompile.ResolverFunc(
		func(path string) (protocompile.SearchResult, error) {
			src, ok := imports[path]
			if path == main {
				src, ok = schema, true
			}
			if !ok {
				return protocompile.SearchResult{}, os.ErrNotExist
			}
			return protocompile.SearchResult{Source: io.NopCloser(strings.NewReader(src))}, nil
		}))}
	files, err := c.Compile(context.Background(), main)
	if err != nil {
		tb.Fatalf("compile the producer's .proto: %v", err)
	}
	return &ProtoFile{FileDescriptor: files[0], types: ProtoTypes(tb, files[0])}
}

// ProtoTypes returns the types of fd and of every file it imports, to
// resolve Any values and message names with.
func ProtoTypes(tb testing.TB, fd protoreflect.FileDescriptor) *dynamicpb.Types {
	tb.Helper()
	reg := new(protoregistry.Files)
	var add func(protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if _, err := reg.FindFileByPath(fd.Path()); err == nil {
			return
		}
		for i := range fd.Imports().Len() {
			add(fd.Imports().Get(i).FileDescriptor)
		}
		if err := reg.RegisterFile(fd); err != nil {
			tb.Fatalf("register %s: %v", fd.Path(), err)
		}
	}
	add(fd)
	return dynamicpb.NewTypes(reg)
}

// Message returns the message type of the file or of its imports with
// the full name given: "test.Order", "test.Envelope.Event".
func (f *ProtoFile) Message(tb testing.TB, name string) protoreflect.MessageDescriptor {
	tb.Helper()
	mt, err := f.types.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		tb.Fatalf("message %s: %v", name, err)
	}
	return mt.Descriptor()
}

// New builds a message of type md from its protojson form (which takes
// .proto and lowerCamelCase field names, 64-bit integers as numbers or
// strings, "NaN", well-known types in their JSON forms, Any of the file's
// types).
func (f *ProtoFile) New(tb testing.TB, md protoreflect.MessageDescriptor, pjson string) *dynamicpb.Message {
	tb.Helper()
	m := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{Resolver: f.types}).Unmarshal([]byte(pjson), m); err != nil {
		tb.Fatalf("protojson %s: %v", pjson, err)
	}
	return m
}

// ProtobufEncoder returns the encoder a producer using franz-go's serde
// with proto.Marshal has for the message at index (Confluent's message
// indexes) of schema id: the Confluent header with the indexes, then the
// message's wire encoding.
func ProtobufEncoder(tb testing.TB, id int, index ...int) func(m *dynamicpb.Message) []byte {
	tb.Helper()
	if len(index) == 0 {
		tb.Fatal("a Protobuf value needs message indexes")
	}
	var serde sr.Serde
	serde.Register(id, &dynamicpb.Message{}, sr.Index(index...), sr.EncodeFn(func(v any) ([]byte, error) {
		return proto.Marshal(v.(proto.Message))
	}))
	return func(m *dynamicpb.Message) []byte {
		b, err := serde.Encode(m)
		if err != nil {
			tb.Fatalf("encode %v with schema id %d at %v: %v", m, id, index, err)
		}
		return b
	}
}

// JSONSchemaEncoder returns the encoder a producer of JSON Schema values
// has for schema id: the Confluent header, then the JSON text as is.
func JSONSchemaEncoder(tb testing.TB, id int) func(json []byte) []byte {
	tb.Helper()
	var h sr.ConfluentHeader
	return func(json []byte) []byte {
		b, err := h.AppendEncode(make([]byte, 0, 5+len(json)), id, nil)
		if err != nil {
			tb.Fatalf("encode with schema id %d: %v", id, err)
		}
		return append(b, json...)
	}
}
