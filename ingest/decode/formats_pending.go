package decode

import (
	"errors"
	"fmt"
)

// errNotBuiltIn is the compile error of a format this build does not
// decode yet: its records are invalid_schema dead letters.
var errNotBuiltIn = errors.New("not built in")

// compileProtobuf stands for the Protobuf compiler of codec.go.
func compileProtobuf(string, []schemaRef) (codec, error) {
	return nil, fmt.Errorf("protobuf: %w", errNotBuiltIn)
}

// compileJSONSchema stands for the JSON Schema compiler of codec.go.
func compileJSONSchema(string, []schemaRef) (codec, error) {
	return nil, fmt.Errorf("json_schema: %w", errNotBuiltIn)
}
