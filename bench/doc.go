// Package bench holds tidemark's throughput benchmarks. Each compares
// tidemark with a baseline measured in the same run, on the same rows and
// the same PostgreSQL server, and prints the ratios; docs/benchmarks.md
// records results and how to reproduce them (make bench).
package bench
