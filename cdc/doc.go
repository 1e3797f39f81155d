// Package cdc will own change data capture from PostgreSQL: a logical
// replication reader (pgoutput) that mirrors source tables with exact
// deletes and records every change as a raw event, confirming replication
// positions only after the warehouse has committed them.
//
// Status: not implemented in this version; the package holds no code yet.
package cdc
