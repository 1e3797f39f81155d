// Package pgcollate tells whether PostgreSQL orders a column's values
// bytewise, in SQL that reads the catalogs.
package pgcollate

// BytewiseSQL is a SQL expression, true when the collation c (a row of
// pg_collation, all NULL for a column that has none) orders text bytewise:
// the C or POSIX collation of the libc provider, named directly or as the
// default of the current database d (a row of pg_database). Such a column
// needs no COLLATE "C" to compare bytewise, and its comparisons cost a
// memcmp, not a strcoll. datlocprovider is read through to_jsonb because
// servers before 15 lack it (they only have libc).
const BytewiseSQL = `CASE
    WHEN c.oid IS NULL THEN true
    WHEN c.collname = 'default' AND c.collnamespace = 'pg_catalog'::regnamespace THEN
        coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c' AND d.datcollate IN ('C', 'POSIX')
    ELSE coalesce(c.collprovider = 'c' AND c.collcollate IN ('C', 'POSIX'), false)
END`
