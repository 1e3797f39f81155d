package config

import "github.com/tidemark-dev/tidemark/internal/pgconnect"

// WarehouseLimits bound how long a warehouse session or a client call may
// wait. The first three are PostgreSQL settings that every warehouse
// session tidemark opens starts with (a value in the connection string
// wins); WriteTimeout is the client's own deadline for one step of a load.
// PostgreSQL accepts the settings up to 2147483647ms, about 24.8 days, and
// refuses a session that starts with more, so longer values are refused
// at load.
type WarehouseLimits struct {
	// StatementTimeout is statement_timeout; zero leaves the server's.
	StatementTimeout Duration `yaml:"statement_timeout"`
	// LockTimeout is lock_timeout; zero leaves the server's.
	LockTimeout Duration `yaml:"lock_timeout"`
	// IdleInTransactionSessionTimeout is
	// idle_in_transaction_session_timeout; zero leaves the server's.
	IdleInTransactionSessionTimeout Duration `yaml:"idle_in_transaction_session_timeout"`
	// WriteTimeout bounds one step of a load on the client (a Kafka batch
	// transaction, a poll chunk, a CDC chunk or commit).
	WriteTimeout Duration `yaml:"write_timeout"`
}

// Settings returns how to reach the warehouse, for package pgconnect.
func (w Warehouse) Settings() pgconnect.Settings {
	return pgconnect.Settings{DSN: w.DSN, MaxConns: int(w.MaxConns), StatementTimeout: w.StatementTimeout.Duration(),
		LockTimeout: w.LockTimeout.Duration(), IdleInTransaction: w.IdleInTransactionSessionTimeout.Duration()}
}

func (c *Config) validateLimits(ix *index) {
	for _, key := range []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout", "write_timeout"} {
		c.check(ix, "warehouse."+key, "")
	}
}
