package pgtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestClusterDatabasesAtOnce: tests that run in parallel set up their
// databases on the shared cluster at the same moment; each registration
// copies the cluster's roles to the workers, which must not collide.
func TestClusterDatabasesAtOnce(t *testing.T) {
	c := pgtest.SharedCluster(t)
	const databases = 6
	for round := range 2 {
		var wg sync.WaitGroup
		for range databases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run("", func(t *testing.T) {
					dsn := c.NewDatabase(t, pgtest.ClusterOptions{})
					conn := pgtest.Conn(t, dsn)
					var workers int
					if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers); err != nil {
						t.Fatal(err)
					}
					if workers != len(c.Workers) {
						t.Errorf("round %d: %d active workers, want %d", round, workers, len(c.Workers))
					}
				})
			}()
		}
		wg.Wait()
	}
}
