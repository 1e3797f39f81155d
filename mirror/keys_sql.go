package mirror

import "github.com/tidemark-dev/tidemark/internal/pgcollate"

// SQL of key reconciliation. Statements that name a table or key columns
// are templates filled by keySide; the placeholders are documented on
// each. The warehouse side reads in one REPEATABLE READ snapshot under
// SessionParams, the source side in another, so every checksum of a
// run sees the same rows.
const (
	// keyCollationSQL tells, for each key column of a table ($1 quoted,
	// qualified name; $2 the key columns in order), whether it is
	// collatable and whether its native ordering is bytewise
	// (pgcollate.BytewiseSQL). Comparisons on such columns need no
	// COLLATE "C" and can use the key's index.
	keyCollationSQL = `
SELECT k.name, a.attcollation <> 0, ` + pgcollate.BytewiseSQL + `
FROM unnest($2::text[]) WITH ORDINALITY AS k (name, ord)
JOIN pg_attribute a ON a.attrelid = to_regclass($1) AND a.attname = k.name AND NOT a.attisdropped
LEFT JOIN pg_collation c ON c.oid = a.attcollation
CROSS JOIN pg_database d
WHERE d.datname = current_database()
ORDER BY k.ord`

	// keyIndexSQL says whether a table has a plain btree index whose
	// leading columns are the key columns in key order ($1 quoted,
	// qualified name; $2 the key columns), so that range predicates on the
	// key are index scans.
	keyIndexSQL = `
SELECT EXISTS (
    SELECT 1
    FROM pg_index AS i
    JOIN pg_class AS ic ON ic.oid = i.indexrelid
    JOIN pg_am AS am ON am.oid = ic.relam
    WHERE i.indrelid = to_regclass($1) AND am.amname = 'btree' AND i.indpred IS NULL AND i.indexprs IS NULL
      AND i.indnkeyatts >= cardinality($2::text[])
      AND ARRAY(SELECT a.attname::text
                FROM generate_series(1, cardinality($2::text[])) AS g (n)
                JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[g.n - 1]
                ORDER BY g.n) = $2::text[])`

	// keyEstimateSQL is the planner's estimate of a table's rows (-1 when
	// it was never analysed) and its pages.
	keyEstimateSQL = `SELECT coalesce(max(reltuples::bigint), -1), coalesce(max(relpages), 0) FROM pg_class WHERE oid = to_regclass($1)`

	// keySampleSQL picks $2 - 1 range bounds, evenly spaced in key order,
	// from a $1 percent block sample of a table. %[1]s table, %[2]s
	// predicate, %[3]s ordering, %[4]s key columns as tm_k1..n, %[5]s the
	// key columns as text.
	keySampleSQL = `
SELECT %[5]s
FROM (
    SELECT %[4]s, row_number() OVER (ORDER BY %[3]s) AS tm_rn, count(*) OVER () AS tm_n
    FROM %[1]s AS m TABLESAMPLE SYSTEM ($1)
    WHERE %[2]s
) AS q
WHERE q.tm_rn > 1 AND (q.tm_rn - 1) * $2 / q.tm_n <> (q.tm_rn - 2) * $2 / q.tm_n
ORDER BY q.tm_rn`

	// keyCountSQL counts a table's live keys in a range. %[1]s table,
	// %[2]s predicate.
	keyCountSQL = `SELECT count(*) FROM %[1]s AS m WHERE %[2]s`

	// keyTilesSQL splits a range of the mirror into tiles of $1 keys in
	// key order and returns, per tile, its key count, its checksum and its
	// first key (one text per key column). %[1]s table, %[2]s predicate,
	// %[3]s ordering, %[4]s key text, %[5]s key columns as tm_k1..n, %[6]s
	// the first key's columns as text.
	keyTilesSQL = `
SELECT count(*), coalesce(sum(q.tm_hash), 0)::text, %[6]s
FROM (
    SELECT %[5]s, hashtextextended((%[4]s) COLLATE "C", 0) AS tm_hash,
           row_number() OVER (ORDER BY %[3]s) AS tm_rn
    FROM %[1]s AS m
    WHERE %[2]s
) AS q
GROUP BY (q.tm_rn - 1) / $1
ORDER BY (q.tm_rn - 1) / $1`

	// keyChecksumSQL is a range's key count and checksum (the sum of the
	// 64-bit hashes of the key texts, as numeric so it cannot overflow).
	// %[1]s table, %[2]s predicate, %[3]s key text.
	keyChecksumSQL = `
SELECT count(*), coalesce(sum(hashtextextended((%[3]s) COLLATE "C", 0)), 0)::text
FROM %[1]s AS m
WHERE %[2]s`

	// keyBucketsSQL computes the count and checksum of adjacent ranges in
	// one pass over their union, for a table whose key index cannot serve
	// bytewise range predicates (a text key column of another collation):
	// the keys and the ranges' lower bounds are sorted together and each
	// key falls in the bucket of the bounds at or below it. %[1]s table,
	// %[2]s predicate of the union, %[3]s key text, %[4]s key columns as
	// tm_k1..n, %[5]s ordering over b, %[6]s unnest arguments (one text
	// array of bounds per key column), %[7]s the bounds cast to the key
	// types, %[8]s column aliases.
	keyBucketsSQL = `
SELECT q.tm_bucket, count(*) FILTER (WHERE q.tm_key), coalesce(sum(q.tm_hash), 0)::text
FROM (
    SELECT b.tm_key, b.tm_hash,
           sum(CASE WHEN b.tm_key THEN 0 ELSE 1 END) OVER (ORDER BY %[5]s, b.tm_key ROWS UNBOUNDED PRECEDING) AS tm_bucket
    FROM (
        SELECT true AS tm_key, hashtextextended((%[3]s) COLLATE "C", 0) AS tm_hash, %[4]s
        FROM %[1]s AS m
        WHERE %[2]s
        UNION ALL
        SELECT false, 0, %[7]s
        FROM unnest(%[6]s) AS u (%[8]s)
    ) AS b
) AS q
GROUP BY q.tm_bucket`

	// keyStreamSQL lists a range's keys in key order: the key text, then
	// each key column as text. %[1]s table, %[2]s predicate, %[3]s
	// ordering, %[4]s key text, %[5]s key columns as text.
	keyStreamSQL = `
SELECT %[4]s, %[5]s
FROM %[1]s AS m
WHERE %[2]s
ORDER BY %[3]s`

	// keyAbsentSQL returns the keys, of those given as arrays ($1 key
	// texts, $2.. one text array per key column), that the table lacks,
	// looked up by the typed key columns (the key's index). Only a typed
	// match counts: a key whose text differs between the two servers
	// (float output, a locale-dependent type) is still found, so it can
	// never be taken for a delete. %[1]s table, %[2]s unnest arguments,
	// %[3]s column aliases, %[4]s the match of m against u.
	keyAbsentSQL = `
SELECT u.tm_key
FROM unnest(%[2]s) AS u (tm_key, %[3]s)
WHERE NOT EXISTS (SELECT 1 FROM %[1]s AS m WHERE %[4]s)`

	// keyEnsureStateSQL and keyLockStateSQL lock the source's poll
	// watermark row, so applying cannot interleave with a poll run of the
	// same source. Two statements, so the lock sees a row another
	// transaction inserted concurrently.
	keyEnsureStateSQL = `INSERT INTO tidemark.poll_watermarks (source) VALUES ($1) ON CONFLICT DO NOTHING`
	keyLockStateSQL   = `SELECT source FROM tidemark.poll_watermarks WHERE source = $1 FOR UPDATE`

	// keyFlagSQL flags the live mirror rows with the given keys as
	// deleted. $1 deleted-at time, $2.. one text array per key column.
	// %[1]s table, %[2]s deleted column, %[3]s unnest arguments, %[4]s
	// column aliases, %[5]s the match of m against u.
	keyFlagSQL = `
UPDATE %[1]s AS m SET %[2]s = $1
FROM unnest(%[3]s) AS u (%[4]s)
WHERE %[5]s AND m.%[2]s IS NULL`

	// keyRemoveSQL removes the mirror rows with the given keys. $1.. one
	// text array per key column. %[1]s table, %[2]s unnest arguments,
	// %[3]s column aliases, %[4]s the match of m against u.
	keyRemoveSQL = `
DELETE FROM %[1]s AS m
USING unnest(%[2]s) AS u (%[3]s)
WHERE %[4]s`

	// keyHistorySQL records one run in tidemark.key_reconciliations.
	keyHistorySQL = `
INSERT INTO tidemark.key_reconciliations
    (source, mirror, started_at, finished_at, dry_run, mode, source_keys, mirror_keys,
     ranges_compared, keys_transferred, missing_at_source, missing_in_mirror, applied,
     refused, forced)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
)
