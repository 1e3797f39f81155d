package decode

// A codec turns the records of one registered schema into JSON text that
// jsonb accepts, mapping the format's types as docs/formats.md says.
type codec interface {
	// toJSON returns the record's value as JSON, within the record's
	// budget b, which it spends. payload is the record value after the
	// Confluent wire header (the magic byte and the schema id); for
	// Protobuf it starts with the message indexes. An error means the
	// bytes do not match the schema (a schema_mismatch dead letter), or,
	// when it wraps errLimit, that decoding them would cost more than b
	// (a decode_limit); its text says where.
	toJSON(payload []byte, b *budget) ([]byte, error)
}

// schemaRef is a schema that another schema references.
type schemaRef struct {
	// Name is how the referencing schema names it: an Avro full name, a
	// .proto import path, a JSON Schema $ref URL.
	Name string
	// Schema is the referenced schema's text.
	Schema string
}

// The compilers, one per format, each return the codec of schema given the
// schemas it references, or an error (an invalid_schema dead letter) when
// the schema is not one the format accepts or uses what tidemark does not
// support:
//
//	compileAvro(schema string, refs []schemaRef) (codec, error)
//	compileProtobuf(schema string, refs []schemaRef) (codec, error)
//	compileJSONSchema(schema string, refs []schemaRef) (codec, error)
