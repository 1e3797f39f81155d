package main

import (
	"fmt"
	"strings"
	"time"
)

// testAggregate is an aggregate of the end-to-end fault tests over the
// traffic they make: the events of ingesttest's workload (each with an
// amount and a user), in the Kafka source events, or the row changes of
// the CDC source shop. The tests that check corrections read its zone and
// horizon from here, as the configuration does.
type testAggregate struct {
	name, source string
	by, column   string        // the partition: its width and its column
	zone         string        // the partition's time zone, "" for UTC
	horizon      time.Duration // lateness_horizon, in whole hours
	beyond       string        // beyond_horizon, "" for the default
	verifyEvery  string        // verify_every, "" for none
	sql          string
}

// soakAggregates are the soak's aggregates: the fault tests' over the
// Kafka events, with horizons of days and a weekly verify.
var soakAggregates = []testAggregate{
	dailySales.with(72*time.Hour, "7d"),
	dailyUsers.with(48*time.Hour, ""),
}

// with returns a with another horizon and verify_every.
func (a testAggregate) with(horizon time.Duration, verifyEvery string) testAggregate {
	a.horizon, a.verifyEvery = horizon, verifyEvery
	return a
}

var (
	dailySales = testAggregate{name: "daily_sales", source: "events", by: "day", column: "sale_date",
		horizon: 48 * time.Hour, beyond: "correction", sql: `
SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
FROM {{events}} GROUP BY 1`}
	dailyUsers = testAggregate{name: "daily_users", source: "events", by: "day", column: "day", zone: "Europe/Berlin",
		horizon: 24 * time.Hour, beyond: "arrival", sql: `
SELECT {{partition}} AS day, count(DISTINCT payload->>'user')::int AS users
FROM {{events}} GROUP BY 1`}
	shopChanges = testAggregate{name: "shop_changes", source: "shop", by: "hour", column: "hour",
		horizon: time.Hour, sql: `
SELECT {{partition}} AS hour, op, count(*)::int AS changes
FROM {{events}} GROUP BY 1, 2`}
)

// aggregatesYAML is the aggregates block of a configuration that defines
// aggs.
func aggregatesYAML(aggs ...testAggregate) string {
	var b strings.Builder
	b.WriteString("aggregates:\n")
	for _, a := range aggs {
		zone := ""
		if a.zone != "" {
			zone = ", time_zone: " + a.zone
		}
		fmt.Fprintf(&b, "  %s:\n    source: %s\n    table: %s\n    partition: {by: %s, column: %s%s}\n    lateness_horizon: %dh\n",
			a.name, a.source, a.name, a.by, a.column, zone, a.horizon/time.Hour)
		if a.beyond != "" {
			fmt.Fprintf(&b, "    beyond_horizon: %s\n", a.beyond)
		}
		if a.verifyEvery != "" {
			fmt.Fprintf(&b, "    verify_every: %s\n", a.verifyEvery)
		}
		b.WriteString("    sql: |")
		for _, line := range strings.Split(strings.TrimSpace(a.sql), "\n") {
			b.WriteString("\n      " + line)
		}
		b.WriteString("\n")
	}
	return b.String()
}
