package pgconnect_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCommitsDurableOnCitus: a warehouse session on a Citus coordinator
// whose synchronous_commit is off runs with local, since a coordinator
// crash after an unwritten commit would split a load across the cluster;
// one server's setting, and a stronger one on Citus, are left as they are.
func TestCommitsDurableOnCitus(t *testing.T) {
	tests := []struct {
		name, server, want string
		citus              bool
	}{
		{"one server, off", "off", "off", false},
		{"Citus, off", "off", "local", true},
		{"Citus, on", "on", "on", true},
		{"Citus, remote_apply", "remote_apply", "remote_apply", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dsn string
			if tt.citus {
				dsn = pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{})
			} else {
				dsn = pgtest.NewDatabase(t)
				if pgtest.OnCitus() {
					t.Skip("every test database is on Citus in this run")
				}
			}
			ctx := context.Background()
			admin := pgtest.Conn(t, dsn)
			var db string
			if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = %s", pgx.Identifier{db}.Sanitize(), tt.server)); err != nil {
				t.Fatal(err)
			}
			pool, err := pgconnect.Pool(ctx, pgconnect.Settings{DSN: dsn}, "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			conn, err := pgconnect.Warehouse(ctx, pgconnect.Settings{DSN: dsn}, "tidemark-test", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for name, q := range map[string]interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}{"pool": pool, "connection": conn} {
				var got string
				if err := q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != tt.want {
					t.Errorf("%s: synchronous_commit %s, want %s", name, got, tt.want)
				}
			}
		})
	}
}
