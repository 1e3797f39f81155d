package migrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestUpIsIdempotentAndConcurrentSafe(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if err := migrate.Check(ctx, pool); err == nil {
		t.Fatal("Check on an empty database succeeded")
	}
	// Several processes starting at once apply each migration once.
	var wg sync.WaitGroup
	results := make([]migrate.Result, 5)
	errs := make([]error, 5)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrate.Up(ctx, dsn, nil)
		}()
	}
	wg.Wait()
	applied := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Up %d: %v", i, err)
		}
		applied += len(results[i].Applied)
		if results[i].Current != migrate.Latest() {
			t.Errorf("Up %d left version %d, want %d", i, results[i].Current, migrate.Latest())
		}
	}
	all, err := migrate.All()
	if err != nil {
		t.Fatal(err)
	}
	if applied != len(all) {
		t.Errorf("%d migrations applied in all, want %d (each once)", applied, len(all))
	}
	if err := migrate.Check(ctx, pool); err != nil {
		t.Errorf("Check after Up: %v", err)
	}
	res, err := migrate.Up(ctx, dsn, nil)
	if err != nil || len(res.Applied) != 0 {
		t.Errorf("second Up: %v, applied %d", err, len(res.Applied))
	}
}

func TestUpRefusesNewerDatabase(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO tidemark.schema_migrations (version, name, checksum) VALUES (9999, 'future', 'x')"); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.Up(ctx, dsn, nil)
	if err == nil || !strings.Contains(err.Error(), "9999") {
		t.Fatalf("Up on a newer database = %v, want a refusal naming version 9999", err)
	}
}
