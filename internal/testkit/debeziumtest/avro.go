package debeziumtest

import (
	"fmt"
	"math/big"
	"time"
)

// AvroEncoders write the records of a stream as Confluent's AvroConverter
// does: each the Confluent wire format of its schema id (registered with
// the schemas of AvroSchemas), then the Avro binary encoding. A stream with
// them has the expected mirror of schemas.enable.
type AvroEncoders struct {
	Key, Value func(v any) []byte
}

// NewAvroEncoders returns the encoders of the connector's records whose
// key and value schemas (AvroSchemas) are registered as keyID and valueID;
// encoder makes one as a producer's serde does, for values of the Go type
// of example.
func NewAvroEncoders(connector string, keyID, valueID int, encoder func(id int, schema string, example any) func(any) []byte) *AvroEncoders {
	key, value := AvroSchemas(connector)
	var example any = avroEnvelope[AvroPGSource]{}
	if connector == MySQL {
		example = avroEnvelope[avroMySQLSource]{}
	}
	return &AvroEncoders{Key: encoder(keyID, key, avroKey{}), Value: encoder(valueID, value, example)}
}

// AvroSchemas are the Avro schemas that the AvroConverter registers for
// the record key and value of the connector's change events of the
// customers table: Debezium's envelope with Kafka Connect's annotations
// (connect.name, connect.parameters), optional fields as ["null", T]
// unions, following Debezium's documentation.
func AvroSchemas(connector string) (key, value string) {
	src := pgSourceSchema
	if connector == MySQL {
		src = mysqlSourceSchema
	}
	return avroKeySchema, fmt.Sprintf(avroEnvelopeSchema, src)
}

const avroKeySchema = `{"type":"record","name":"Key","namespace":"dbserver1.public.customers","fields":[
{"name":"id","type":"int"}],"connect.name":"dbserver1.public.customers.Key"}`

const avroEnvelopeSchema = `{"type":"record","name":"Envelope","namespace":"dbserver1.public.customers","fields":[
{"name":"before","type":["null",{"type":"record","name":"Value","fields":[
  {"name":"id","type":"int"},
  {"name":"name","type":["null","string"],"default":null},
  {"name":"bio","type":["null","string"],"default":null},
  {"name":"balance","type":["null",{"type":"bytes","scale":2,"precision":12,"connect.version":1,
    "connect.parameters":{"scale":"2","connect.decimal.precision":"12"},
    "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
  {"name":"born","type":["null",{"type":"int","connect.version":1,"connect.name":"io.debezium.time.Date"}],"default":null}],
  "connect.name":"dbserver1.public.customers.Value"}],"default":null},
{"name":"after","type":["null","Value"],"default":null},
{"name":"source","type":%s},
{"name":"op","type":"string"},
{"name":"ts_ms","type":["null","long"],"default":null},
{"name":"transaction","type":["null",{"type":"record","name":"block","namespace":"event","fields":[
  {"name":"id","type":"string"},{"name":"total_order","type":"long"},{"name":"data_collection_order","type":"long"}],
  "connect.version":1,"connect.name":"event.block"}],"default":null}],
"connect.version":1,"connect.name":"dbserver1.public.customers.Envelope"}`

// snapshotSchema is source.snapshot: an io.debezium.data.Enum string.
const snapshotSchema = `{"name":"snapshot","type":[{"type":"string","connect.version":1,
  "connect.parameters":{"allowed":"true,last,false,incremental"},"connect.default":"false",
  "connect.name":"io.debezium.data.Enum"},"null"],"default":"false"}`

const pgSourceSchema = `{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
{"name":"version","type":"string"},{"name":"connector","type":"string"},{"name":"name","type":"string"},
{"name":"ts_ms","type":"long"},` + snapshotSchema + `,
{"name":"db","type":"string"},{"name":"sequence","type":["null","string"],"default":null},
{"name":"schema","type":"string"},{"name":"table","type":"string"},
{"name":"txId","type":["null","long"],"default":null},{"name":"lsn","type":["null","long"],"default":null},
{"name":"xmin","type":["null","long"],"default":null}],
"connect.name":"io.debezium.connector.postgresql.Source"}`

const mysqlSourceSchema = `{"type":"record","name":"Source","namespace":"io.debezium.connector.mysql","fields":[
{"name":"version","type":"string"},{"name":"connector","type":"string"},{"name":"name","type":"string"},
{"name":"ts_ms","type":"long"},` + snapshotSchema + `,
{"name":"db","type":"string"},{"name":"sequence","type":["null","string"],"default":null},
{"name":"table","type":["null","string"],"default":null},{"name":"server_id","type":"long"},
{"name":"gtid","type":["null","string"],"default":null},{"name":"file","type":"string"},
{"name":"pos","type":"long"},{"name":"row","type":"int"},
{"name":"thread","type":["null","long"],"default":null},{"name":"query","type":["null","string"],"default":null}],
"connect.name":"io.debezium.connector.mysql.Source"}`

type avroKey struct {
	ID int32 `avro:"id"`
}

type avroRow struct {
	ID      int32   `avro:"id"`
	Name    *string `avro:"name"`
	Bio     *string `avro:"bio"`
	Balance []byte  `avro:"balance"`
	Born    *int32  `avro:"born"`
}

type avroTransaction struct {
	ID                  string `avro:"id"`
	TotalOrder          int64  `avro:"total_order"`
	DataCollectionOrder int64  `avro:"data_collection_order"`
}

type avroEnvelope[S any] struct {
	Before      *avroRow         `avro:"before"`
	After       *avroRow         `avro:"after"`
	Source      S                `avro:"source"`
	Op          string           `avro:"op"`
	TsMs        *int64           `avro:"ts_ms"`
	Transaction *avroTransaction `avro:"transaction"`
}

// AvroPGSource is the source block of the PostgreSQL connector's Avro
// envelopes, as the AvroConverter encodes it.
type AvroPGSource struct {
	Version   string  `avro:"version"`
	Connector string  `avro:"connector"`
	Name      string  `avro:"name"`
	TsMs      int64   `avro:"ts_ms"`
	Snapshot  *string `avro:"snapshot"`
	DB        string  `avro:"db"`
	Sequence  *string `avro:"sequence"`
	Schema    string  `avro:"schema"`
	Table     string  `avro:"table"`
	TxID      *int64  `avro:"txId"`
	LSN       *int64  `avro:"lsn"`
	Xmin      *int64  `avro:"xmin"`
}

type avroMySQLSource struct {
	Version   string  `avro:"version"`
	Connector string  `avro:"connector"`
	Name      string  `avro:"name"`
	TsMs      int64   `avro:"ts_ms"`
	Snapshot  *string `avro:"snapshot"`
	DB        string  `avro:"db"`
	Sequence  *string `avro:"sequence"`
	Table     *string `avro:"table"`
	ServerID  int64   `avro:"server_id"`
	GTID      *string `avro:"gtid"`
	File      string  `avro:"file"`
	Pos       int64   `avro:"pos"`
	Row       int32   `avro:"row"`
	Thread    *int64  `avro:"thread"`
	Query     *string `avro:"query"`
}

// avroValue is the record value of a change, for AvroEncoders.Value.
func (s *Stream) avroValue(op string, id int64, v Values, unavailable []string, src map[string]any, at time.Time) any {
	var before, after *avroRow
	switch op {
	case "c", "r", "u":
		after = avroRowOf(id, v, unavailable)
	case "d":
		before = &avroRow{ID: int32(id)} // the key, the rest null
	}
	ts := at.UnixMilli() + 250
	str := func(k string) string { return src[k].(string) }
	snapshot := str("snapshot")
	if s.Connector == MySQL {
		table := str("table")
		return avroEnvelope[avroMySQLSource]{Before: before, After: after, Op: op, TsMs: &ts, Source: avroMySQLSource{
			Version: str("version"), Connector: str("connector"), Name: str("name"), TsMs: src["ts_ms"].(int64),
			Snapshot: &snapshot, DB: str("db"), Table: &table, ServerID: int64(src["server_id"].(int)), File: str("file"),
			Pos: src["pos"].(int64), Row: int32(src["row"].(int64)), Thread: ptr(int64(src["thread"].(int))),
		}}
	}
	seq := str("sequence")
	return avroEnvelope[AvroPGSource]{Before: before, After: after, Op: op, TsMs: &ts, Source: AvroPGSource{
		Version: str("version"), Connector: str("connector"), Name: str("name"), TsMs: src["ts_ms"].(int64),
		Snapshot: &snapshot, DB: str("db"), Sequence: &seq, Schema: str("schema"), Table: str("table"),
		TxID: ptr(src["txId"].(int64)), LSN: ptr(src["lsn"].(int64)),
	}}
}

// avroRowOf is a row as the AvroConverter encodes it.
func avroRowOf(id int64, v Values, unavailable []string) *avroRow {
	r := &avroRow{ID: int32(id), Name: ptr(v.Name), Bio: ptr(v.Bio), Balance: decimalBytes(v.Balance), Born: ptr(v.Born)}
	for _, c := range unavailable {
		switch c {
		case "name":
			r.Name = ptr("__debezium_unavailable_value")
		case "bio":
			r.Bio = ptr("__debezium_unavailable_value")
		default:
			panic("no unavailable value of column " + c)
		}
	}
	return r
}

func ptr[T any](v T) *T { return &v }

// decimalBytes is a number of cents as Connect's Decimal of scale 2: the
// unscaled value's big-endian two's complement.
func decimalBytes(c int64) []byte {
	n := big.NewInt(c)
	if c >= 0 {
		return append([]byte{0}, n.Bytes()...)
	}
	size := len(new(big.Int).Neg(n).Bytes()) + 1
	b := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*size)), n).Bytes()
	for len(b) < size {
		b = append([]byte{0xff}, b...)
	}
	return b
}
