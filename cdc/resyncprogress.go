package cdc

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// plannedRowsSQL is the source's estimate of a table's rows: the sum of
// pg_class.reltuples over its leaf partitions, or the table's own when it
// is not partitioned; NULL when one of them was never analysed
// (reltuples -1), or the table is not found.
const plannedRowsSQL = `
SELECT CASE WHEN count(*) = 0 OR bool_or(c.reltuples < 0) THEN NULL ELSE sum(c.reltuples)::bigint END
FROM pg_class c
WHERE (c.oid = to_regclass($1) AND c.relkind <> 'p')
   OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)) WHERE isleaf)`

// plannedRows returns the source's estimate of the rows of table id,
// which a resync's progress is measured against; nil when it has none.
func plannedRows(ctx context.Context, src Querier, id pgx.Identifier) (*int64, error) {
	var n *int64
	if err := src.QueryRow(ctx, plannedRowsSQL, id.Sanitize()).Scan(&n); err != nil {
		return nil, err
	}
	return n, nil
}

// resyncProgress sets the progress series of the resync of table from
// its row in tidemark.cdc_resyncs, as the chunks applied left it. A
// failure to read it is logged: the copy does not need it.
func (r *Reader) resyncProgress(ctx context.Context, table string) {
	rs, ok, err := LastResync(ctx, r.pool, r.conf.Source, table)
	if err != nil || !ok {
		r.log.Debug("resync: the progress could not be read", "table", table, "error", err)
		return
	}
	r.m.resyncCopied.WithLabelValues(table).Set(float64(rs.Rows))
	if rs.Planned != nil {
		r.m.resyncPlanned.WithLabelValues(table).Set(float64(*rs.Planned))
	} else {
		r.m.resyncPlanned.DeleteLabelValues(table)
	}
}
