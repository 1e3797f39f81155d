package config

// Retention bounds the state tables that grow with time. Each age is
// measured on the service clock; rows still needed are kept whatever their
// age (see docs/state.md, "Retention").
type Retention struct {
	// Every is how often `tidemark run` prunes.
	Every Duration `yaml:"every"`
	// Ledger keeps ingest ledger rows this long after their load, and at
	// least until every aggregate of their source has read them.
	Ledger Duration `yaml:"ledger"`
	// Corrections keeps beyond-horizon events this long after they were
	// recorded, and under the arrival policy at least until the partition
	// they are counted in is archived.
	Corrections Duration `yaml:"corrections"`
	// Arrivals keeps a partition's arrival history this long after the
	// partition's end, and for the partitions the completeness estimate
	// learns from.
	Arrivals Duration `yaml:"arrivals"`
	// Runs keeps finished backfill, refresh, verify and key reconciliation
	// runs this long, and the latest of each kind.
	Runs Duration `yaml:"runs"`
	// LockTimeout bounds the wait for the lock that dropping a raw
	// partition needs; a busy table is tried again at the next run.
	LockTimeout Duration `yaml:"lock_timeout"`
}

// SourceRetention is how long a source's raw rows and dead letters are
// kept.
type SourceRetention struct {
	// Raw keeps a raw partition until its end is this far behind the
	// service clock, and at least until every aggregate partition it feeds
	// is final and read. Poll and CDC sources too; table sources are not
	// tidemark's to prune.
	Raw Duration `yaml:"raw"`
	// DeadLetters keeps dead letters this long after they arrived.
	DeadLetters Duration `yaml:"dead_letters"`

	written bool // the file sets a value
}

func (c *Config) validateRetention(ix *index) {
	for _, key := range []string{"every", "ledger", "corrections", "arrivals", "runs", "lock_timeout"} {
		c.check(ix, "retention."+key, "")
	}
	for _, name := range c.SourceNames() {
		s := c.Sources[name]
		if s == nil {
			continue
		}
		p := "sources." + name + ".retention"
		if s.Table != nil && s.Retention.written {
			ix.add(p, "applies to Kafka, poll and CDC sources; a table source's table belongs to the tool that writes it")
			continue
		}
		c.check(ix, "sources.<name>.retention.raw", name)
		c.check(ix, "sources.<name>.retention.dead_letters", name)
	}
}
