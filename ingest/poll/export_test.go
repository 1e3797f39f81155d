package poll

// SetMergeOnly makes every run of p merge, as after a COPY met a stored
// row, even into an empty mirror and raw table.
func SetMergeOnly(p *Poller) { p.mergeOnly = true }
