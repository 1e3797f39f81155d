package config

import (
	"math"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
)

// Defaults of the warehouse session limits.
const (
	DefaultIdleInTransactionSessionTimeout = 5 * time.Minute
	DefaultWriteTimeout                    = 2 * time.Minute
)

// WarehouseLimits bound how long a warehouse session or a client call may
// wait. The first three are PostgreSQL settings that every warehouse
// session tidemark opens starts with (a value in the connection string
// wins); WriteTimeout is the client's own deadline for one step of a load.
type WarehouseLimits struct {
	// StatementTimeout is statement_timeout; zero leaves the server's.
	StatementTimeout Duration `yaml:"statement_timeout"`
	// LockTimeout is lock_timeout; zero leaves the server's.
	LockTimeout Duration `yaml:"lock_timeout"`
	// IdleInTransactionSessionTimeout is
	// idle_in_transaction_session_timeout; default 5m, zero leaves the
	// server's.
	IdleInTransactionSessionTimeout *Duration `yaml:"idle_in_transaction_session_timeout"`
	// WriteTimeout bounds one step of a load on the client (a Kafka batch
	// transaction, a poll chunk, a CDC chunk or commit); default 2m.
	WriteTimeout Duration `yaml:"write_timeout"`
}

// IdleInTransaction returns idle_in_transaction_session_timeout with its
// default applied.
func (w WarehouseLimits) IdleInTransaction() time.Duration {
	if w.IdleInTransactionSessionTimeout == nil {
		return DefaultIdleInTransactionSessionTimeout
	}
	return w.IdleInTransactionSessionTimeout.D()
}

// Settings returns how to reach the warehouse, for package pgconnect.
func (w Warehouse) Settings() pgconnect.Settings {
	return pgconnect.Settings{DSN: w.DSN, MaxConns: int(w.MaxConns), StatementTimeout: w.StatementTimeout.D(),
		LockTimeout: w.LockTimeout.D(), IdleInTransaction: w.IdleInTransaction()}
}

// Write returns write_timeout with its default applied.
func (w WarehouseLimits) Write() time.Duration {
	if w.WriteTimeout == 0 {
		return DefaultWriteTimeout
	}
	return w.WriteTimeout.D()
}

// MaxSessionTimeout is the longest statement_timeout, lock_timeout and
// idle_in_transaction_session_timeout PostgreSQL accepts: 2147483647ms,
// about 24.8 days. A longer value would make every session fail to start.
const MaxSessionTimeout = math.MaxInt32 * time.Millisecond

func (c *Config) validateLimits(ix *index) {
	w := c.Warehouse.WarehouseLimits
	for key, d := range map[string]Duration{"statement_timeout": w.StatementTimeout, "lock_timeout": w.LockTimeout} {
		if d < 0 || (d > 0 && d.D() < time.Millisecond) || d.D() > MaxSessionTimeout {
			ix.add("warehouse."+key, "must be 0 (the server's setting) or between 1ms and 2147483647ms (about 24.8 days, PostgreSQL's limit)")
		}
	}
	if d := w.IdleInTransaction(); d < 0 || (d > 0 && d < time.Second) || d > MaxSessionTimeout {
		ix.add("warehouse.idle_in_transaction_session_timeout", "must be 0 (the server's setting) or between 1s and 2147483647ms (about 24.8 days, PostgreSQL's limit)")
	}
	// The ingester's sessions carry write_timeout as statement_timeout.
	if d := w.Write(); d < 100*time.Millisecond || d > MaxSessionTimeout {
		ix.add("warehouse.write_timeout", "must be between 100ms and 2147483647ms (about 24.8 days: the ingester's sessions carry it as statement_timeout, which PostgreSQL limits to that)")
	}
}
