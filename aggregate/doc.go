// Package aggregate owns event-date aggregates: their definitions, the
// calendar of their partitions, and Rebuild, the one code path that writes
// an aggregate table.
//
// An aggregate is a SQL SELECT written by the user over {{events}}, the raw
// rows of one event-time partition, returning the rows of that partition;
// {{partition}} is the partition's key (a date for day and month
// partitions, the start instant for hours). Partitions are hours, days or
// months in an IANA time zone, computed with the zone's rules, so a day on
// which the clocks change lasts 23 or 25 hours.
//
// {{events}} applies the aggregate's lateness horizon using stored columns
// only: an event belongs to its partition if it was ingested no later than
// the partition's end plus the horizon. Later events are handled by the
// beyond-horizon policy: correction leaves them out (the reconciler
// records them in tidemark.corrections), arrival counts them in the
// partition of their ingestion time, rebuild ignores the horizon. Because
// the rule reads only stored columns, rebuilding a partition at any later
// time gives the same answer as the incremental runs did.
//
// Prepare checks a definition against the warehouse, refusing a query
// that reads tidemark's own tables, and creates the target table from the
// query's columns when it is missing. Rebuild replaces one
// partition in the caller's transaction and records it in
// tidemark.partitions.
package aggregate
