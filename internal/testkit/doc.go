// Package testkit names the directory of tidemark's test harnesses; it
// holds no code. Each harness is a package below it: pgtest gives tests
// PostgreSQL (started by internal/pgserver, which the demo uses too),
// kafkatest starts Kafka-protocol brokers, faultproxy and faulttest
// inject network faults, srtest is a schema registry, ingesttest
// generates workloads with known outcomes, debeziumtest builds Debezium
// change streams and the mirror they must leave, waitfor is the one way
// tests wait, docsql reads the SQL a documentation page gives to run, and
// testenv, testcert, syncbuf and benchplot hold the rest. Only tests and the benchmarks
// import them, so none is linked into the binary.
package testkit
