package lateness

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
)

// Point is one step of an arrival curve: the average share of a final
// partition's rows that had arrived by Age seconds after its end.
type Point struct {
	Age   int64   `json:"age_seconds"`
	Share float64 `json:"share"`
}

// ArrivalCurve is the arrival history of an aggregate's latest final
// partitions: the evidence behind the completeness estimate of the
// partitions that are not final, which is the curve read at their age.
type ArrivalCurve struct {
	Aggregate string `json:"aggregate"`
	// Partitions is how many final partitions the curve averages.
	Partitions int     `json:"partitions"`
	Points     []Point `json:"points"`
}

// curveSQL averages, over the latest $2 final partitions of aggregate $1
// that have an arrival history, the share of each partition's rows that
// had arrived by each age step of any of them. The reconciler's
// completeness estimate is this curve read at a partition's age.
const curveSQL = `
WITH finals AS (
    SELECT partition_start FROM tidemark.partitions
    WHERE aggregate = $1 AND state IN ('final', 'archived')
    ORDER BY partition_start DESC LIMIT $2
), a AS (
    SELECT a.partition_start, a.age_seconds,
           sum(a.rows) OVER (PARTITION BY a.partition_start ORDER BY a.age_seconds) AS arrived,
           sum(a.rows) OVER (PARTITION BY a.partition_start) AS total
    FROM tidemark.partition_arrivals a JOIN finals f USING (partition_start)
    WHERE a.aggregate = $1
), parts AS (
    SELECT DISTINCT partition_start, total FROM a WHERE total > 0
), ages AS (
    SELECT DISTINCT age_seconds FROM a
)
SELECT g.age_seconds, avg(coalesce((SELECT max(x.arrived) FROM a x
                                    WHERE x.partition_start = p.partition_start AND x.age_seconds <= g.age_seconds), 0)
                          / p.total)::float8,
       count(*)
FROM ages g CROSS JOIN parts p
GROUP BY 1 ORDER BY 1`

// HistoryPartitions is how many recent final partitions of an aggregate
// partitioned by by the completeness estimate learns from; retention keeps
// their arrival histories.
func HistoryPartitions(by string) int {
	switch by {
	case aggregate.Hour:
		return 24
	case aggregate.Month:
		return 3
	}
	return 7
}

// ErrNoHistory is returned by Curve when no final partition has an
// arrival history.
var ErrNoHistory = errors.New("no final partition has an arrival history yet")

// Curve reads the arrival curve of aggregate name over its latest
// partitions final partitions. It returns ErrNoHistory when there is none.
func Curve(ctx context.Context, q Querier, name string, partitions int) (*ArrivalCurve, error) {
	rows, err := q.Query(ctx, curveSQL, name, partitions)
	if err != nil {
		return nil, fmt.Errorf("arrival curve of %s: %w", name, err)
	}
	c := &ArrivalCurve{Aggregate: name}
	c.Points, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Point, error) {
		var p Point
		var n int
		err := row.Scan(&p.Age, &p.Share, &n)
		c.Partitions = n
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("arrival curve of %s: %w", name, err)
	}
	if len(c.Points) == 0 {
		return nil, ErrNoHistory
	}
	return c, nil
}

// At reads the curve at age seconds: the share arrived by then, as the
// completeness estimate computes it.
func (c *ArrivalCurve) At(age float64) float64 {
	share := 0.0
	for _, p := range c.Points {
		if float64(p.Age) > age {
			break
		}
		share = p.Share
	}
	return share
}
