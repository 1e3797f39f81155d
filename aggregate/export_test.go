package aggregate

// InsertSQL is the statement with which Rebuild inserts p's rows, for
// tests that read its plan.
func InsertSQL(d *Definition, p Partition) string { return d.insertSQL(p) }
