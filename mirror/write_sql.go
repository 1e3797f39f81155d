package mirror

// SQL of a Txn's writes of folded changes to a mirror (see Txn.Write).
const (
	// createStageSQL creates the stage of one mirror: the net change of
	// each key of a run of changes, with the source table's columns in the
	// mirror's types. "tidemark absent" lists the columns the change did
	// not carry (unchanged TOAST values), which keep their stored value;
	// the "tidemark from" columns hold, for a row whose key changed, the
	// old key, whose mirror row provides those values. %[1]s stage, %[2]s
	// old-key columns, %[3]s columns.
	createStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS %[1]s (
    "tidemark kind" text, "tidemark at" timestamptz, "tidemark absent" text[], %[2]s, %[3]s
) ON COMMIT DELETE ROWS`
	// copyStageSQL fills a stage; %[1]s is the stage.
	copyStageSQL     = `COPY %[1]s FROM STDIN`
	truncateStageSQL = `TRUNCATE %s`

	// updateMirrorSQL updates the mirror rows of staged upserts. %[1]s
	// mirror, %[2]s stage, %[3]s SET list, %[4]s key match of t and s,
	// %[5]s the join of the old key's row o (or nothing).
	updateMirrorSQL = `
UPDATE %[1]s AS t SET %[3]s
FROM %[2]s AS s %[5]s
WHERE s."tidemark kind" = 'upsert' AND %[4]s`

	// insertMirrorSQL inserts, after updateMirrorSQL, the staged upserts
	// whose key the mirror does not have: those it has were updated. (A
	// correlated NOT EXISTS would say the same, but Citus does not plan
	// one over a distributed mirror and a local stage.) %[1]s mirror,
	// %[2]s stage, %[3]s columns, %[4]s values, %[5]s key columns, %[6]s
	// loaded and deleted columns, %[7]s the join of the old key's row o
	// (or nothing).
	insertMirrorSQL = `
INSERT INTO %[1]s (%[3]s, %[6]s)
SELECT %[4]s, $1, NULL
FROM %[2]s AS s %[7]s
WHERE s."tidemark kind" = 'upsert'
ON CONFLICT (%[5]s) DO NOTHING`

	// upsertMirrorSQL writes staged upserts that carry every column, in
	// one statement: a run holds one upsert per key at most. %[1]s
	// mirror, %[2]s stage, %[3]s columns, %[4]s s's columns, %[5]s key
	// columns, %[6]s SET list, %[7]s loaded and deleted columns.
	upsertMirrorSQL = `
INSERT INTO %[1]s AS t (%[3]s, %[7]s)
SELECT %[4]s, $1, NULL
FROM %[2]s AS s
WHERE s."tidemark kind" = 'upsert'
ON CONFLICT (%[5]s) DO UPDATE SET %[6]s`

	// Fresh rows: upserts of keys that a run inserted first, which the
	// mirror most likely lacks, are COPYed straight into it under a
	// savepoint; when a key is there after all (re-inserted after a soft
	// delete), the savepoint is rolled back and they are staged with the
	// rest. The savepoint is not released: savepoints nest, and ROLLBACK
	// TO goes back to the latest of the name. %[1]s mirror, %[2]s
	// columns, %[3]s loaded and deleted columns.
	copyFreshSQL       = `COPY %[1]s (%[2]s, %[3]s) FROM STDIN`
	savepointFreshSQL  = `SAVEPOINT tidemark_fresh`
	rollbackToFreshSQL = `ROLLBACK TO SAVEPOINT tidemark_fresh`

	// flagMirrorSQL marks staged deletes (soft); removeMirrorSQL removes
	// them (hard). %[1]s mirror, %[2]s stage, %[3]s deleted column, %[4]s
	// key match.
	flagMirrorSQL = `
UPDATE %[1]s AS t SET %[3]s = s."tidemark at"
FROM %[2]s AS s
WHERE s."tidemark kind" = 'delete' AND %[4]s AND t.%[3]s IS NULL`
	removeMirrorSQL = `
DELETE FROM %[1]s AS t
USING %[2]s AS s
WHERE s."tidemark kind" = 'delete' AND %[4]s`
)

// SQL of positioned stages (see Relation.Position and Relation.JSON).
// The statements read the stage as s and a staged row's values as v: the
// mirror's row type filled from the JSON row, or the stage itself.
const (
	// createPositionedStageSQL creates a positioned stage: per key an
	// upsert or a delete, its commit time, the columns it lacks, its
	// position, for an upsert older than a truncate that truncate's time,
	// and the row. %[1]s stage, %[2]s the row's columns.
	createPositionedStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS %[1]s (
    "tidemark kind" text, "tidemark at" timestamptz, "tidemark absent" text[],
    "tidemark pos" bigint[], "tidemark gone" timestamptz, %[2]s
) ON COMMIT DELETE ROWS`

	// updatePositionedSQL updates the mirror rows of staged upserts; a
	// column the row lacks keeps its stored value. %[1]s mirror, %[2]s
	// the stage and its values, %[3]s SET list of the columns besides the
	// key, each followed by a comma, %[4]s loaded column, %[5]s deleted
	// column, %[6]s the position's SET (or nothing), %[7]s key match of t
	// and v, %[8]s the test that the change is newer (or nothing).
	updatePositionedSQL = `
UPDATE %[1]s AS t SET %[3]s%[4]s = $1, %[5]s = s."tidemark gone"%[6]s
FROM %[2]s
WHERE s."tidemark kind" = 'upsert' AND %[7]s%[8]s`

	// insertPositionedSQL inserts, after updatePositionedSQL, the staged
	// upserts whose key the mirror lacks. (ON CONFLICT rather than a
	// correlated NOT EXISTS, which Citus does not plan over a distributed
	// mirror and a local stage.) %[1]s mirror, %[2]s the stage and its
	// values, %[3]s columns, %[4]s loaded column, %[5]s deleted column,
	// %[6]s the position column (or nothing), %[7]s v's columns, %[8]s
	// the staged position (or nothing), %[9]s key columns.
	insertPositionedSQL = `
INSERT INTO %[1]s (%[3]s, %[4]s, %[5]s%[6]s)
SELECT %[7]s, $1, s."tidemark gone"%[8]s
FROM %[2]s
WHERE s."tidemark kind" = 'upsert'
ON CONFLICT (%[9]s) DO NOTHING`

	// flagPositionedSQL flags the mirror rows of staged deletes. %[1]s
	// mirror, %[2]s the stage and its values, %[3]s deleted column, %[4]s
	// the position's SET (or nothing), %[5]s key match, %[6]s the test
	// that the change is newer, or that the row is not flagged yet.
	flagPositionedSQL = `
UPDATE %[1]s AS t SET %[3]s = s."tidemark at"%[4]s
FROM %[2]s
WHERE s."tidemark kind" = 'delete' AND %[5]s%[6]s`

	// removePositionedSQL removes the mirror rows of staged deletes (hard
	// deletes, without a position column). %[1]s mirror, %[2]s the stage
	// and its values, %[3]s key match.
	removePositionedSQL = `
DELETE FROM %[1]s AS t
USING %[2]s
WHERE s."tidemark kind" = 'delete' AND %[3]s`

	// tombstoneSQL inserts, for the staged deletes of keys the mirror
	// lacks, a flagged row of the key, its other columns NULL, holding the
	// delete's position, so that the change before it, sent again, does
	// not bring the row back. %[1]s mirror, %[2]s the stage and its
	// values, %[3]s columns, %[4]s loaded column, %[5]s deleted column,
	// %[6]s position column, %[7]s v's columns (a delete's stage row has
	// its key's only), %[8]s the staged position, %[9]s key columns.
	tombstoneSQL = `
INSERT INTO %[1]s (%[3]s, %[4]s, %[5]s%[6]s)
SELECT %[7]s, $1, s."tidemark at"%[8]s
FROM %[2]s
WHERE s."tidemark kind" = 'delete'
ON CONFLICT (%[9]s) DO NOTHING`
)
