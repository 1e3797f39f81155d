package config

import "time"

// Retention bounds the state tables that grow with time. Each age is
// measured on the service clock; rows still needed are kept whatever their
// age (see docs/state.md, "Retention").
type Retention struct {
	// Every is how often `tidemark run` prunes; default 1h.
	Every Duration `yaml:"every"`
	// Ledger keeps ingest ledger rows this long after their load, and at
	// least until every aggregate of their source has read them; default 7d.
	Ledger Duration `yaml:"ledger"`
	// Corrections keeps beyond-horizon events this long after they were
	// recorded, and under the arrival policy at least until the partition
	// they are counted in is archived; default 90d.
	Corrections Duration `yaml:"corrections"`
	// Arrivals keeps a partition's arrival history this long after the
	// partition's end, and for the partitions the completeness estimate
	// learns from; default 90d.
	Arrivals Duration `yaml:"arrivals"`
	// Runs keeps finished backfill, refresh, verify and key reconciliation
	// runs this long, and the latest of each kind; default 90d.
	Runs Duration `yaml:"runs"`
	// LockTimeout bounds the wait for the lock that dropping a raw
	// partition needs; a busy table is tried again at the next run.
	// Default 2s.
	LockTimeout Duration `yaml:"lock_timeout"`
}

// SourceRetention is how long a source's raw rows and dead letters are
// kept.
type SourceRetention struct {
	// Raw keeps a raw partition until its end is this far behind the
	// service clock, and at least until every aggregate partition it feeds
	// is final and read; default 400d. Poll and CDC sources too; table
	// sources are not tidemark's to prune.
	Raw Duration `yaml:"raw"`
	// DeadLetters keeps dead letters this long after they arrived;
	// default 30d.
	DeadLetters Duration `yaml:"dead_letters"`

	written bool // the file sets a value
}

// Retention defaults.
const (
	DefaultRetentionEvery       = time.Hour
	DefaultRetentionLedger      = 7 * 24 * time.Hour
	DefaultRetentionCorrections = 90 * 24 * time.Hour
	DefaultRetentionArrivals    = 90 * 24 * time.Hour
	DefaultRetentionRuns        = 90 * 24 * time.Hour
	DefaultRetentionLockTimeout = 2 * time.Second
	DefaultRetentionRaw         = 400 * 24 * time.Hour
	DefaultRetentionDeadLetters = 30 * 24 * time.Hour
)

func (c *Config) applyRetentionDefaults() {
	r := &c.Retention
	for _, d := range []struct {
		v   *Duration
		def time.Duration
	}{
		{&r.Every, DefaultRetentionEvery}, {&r.Ledger, DefaultRetentionLedger}, {&r.Corrections, DefaultRetentionCorrections},
		{&r.Arrivals, DefaultRetentionArrivals}, {&r.Runs, DefaultRetentionRuns}, {&r.LockTimeout, DefaultRetentionLockTimeout},
	} {
		if *d.v == 0 {
			*d.v = Duration(d.def)
		}
	}
	for _, s := range c.Sources {
		if s == nil {
			continue
		}
		s.Retention.written = s.Retention != (SourceRetention{})
		if s.Retention.Raw == 0 {
			s.Retention.Raw = Duration(DefaultRetentionRaw)
		}
		if s.Retention.DeadLetters == 0 {
			s.Retention.DeadLetters = Duration(DefaultRetentionDeadLetters)
		}
	}
}

func (c *Config) validateRetention(ix *index) {
	r := c.Retention
	if r.Every.D() < time.Second {
		ix.add("retention.every", "must be at least 1s")
	}
	if r.LockTimeout.D() < 10*time.Millisecond || r.LockTimeout.D() > time.Minute {
		ix.add("retention.lock_timeout", "must be between 10ms and 1m")
	}
	for key, d := range map[string]Duration{"ledger": r.Ledger, "corrections": r.Corrections, "arrivals": r.Arrivals, "runs": r.Runs} {
		if d < 0 {
			ix.add("retention."+key, "must not be negative")
		}
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
		if s.Retention.Raw < Duration(24*time.Hour) {
			ix.add(p+".raw", "must be at least 1d (raw partitions are dropped whole)")
		}
		if s.Retention.DeadLetters < 0 {
			ix.add(p+".dead_letters", "must not be negative")
		}
	}
}
