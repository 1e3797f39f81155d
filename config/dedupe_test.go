package config

import (
	"testing"
	"time"
)

// TestDedupe parses sources.<name>.dedupe: its default, the window it
// needs, its bounds, and its refusal on sources other than Kafka's.
func TestDedupe(t *testing.T) {
	tests := []struct {
		name   string
		data   string
		window time.Duration // DedupeWindow of app_events when valid
		want   []wantErr
	}{
		{"left out", base(), 0, nil},
		{"by none", base("    dedupe: {by: none}"), 0, nil},
		{"by event_id", base("    dedupe: {by: event_id, window: 7d}"), 7 * 24 * time.Hour, nil},
		{"window alone defaults by to none", base("    dedupe: {window: 7d}"), 0, nil},
		{"largest window", base("    dedupe: {by: event_id, window: 366d}"), 366 * 24 * time.Hour, nil},
		{"unknown by", base("    dedupe: {by: payload, window: 7d}"), 0,
			[]wantErr{{11, "sources.app_events.dedupe.by", `must be one of none, event_id, got "payload"`}}},
		{"window missing", base("    dedupe:", "      by: event_id"), 0,
			[]wantErr{{11, "sources.app_events.dedupe.window", "is required with dedupe.by: event_id"}}},
		{"window too short", base("    dedupe:", "      by: event_id", "      window: 10m"), 0,
			[]wantErr{{13, "sources.app_events.dedupe.window", "must be between 1h and 366d (ids are kept for the window"}}},
		{"window too long", base("    dedupe: {by: event_id, window: 400d}"), 0,
			[]wantErr{{11, "sources.app_events.dedupe.window", "must be between 1h and 366d"}}},
		{"not on a poll source", pollBase + "    dedupe: {by: event_id, window: 7d}\n", 0,
			[]wantErr{{12, "sources.customers.dedupe", "applies to Kafka sources only"}}},
		{"not on a table source", lines("warehouse:", "  dsn: postgres://h/db", "sources:", "  partner:",
			"    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}",
			"    dedupe: {by: event_id, window: 7d}"), 0,
			[]wantErr{{6, "sources.partner.dedupe", "applies to Kafka sources only"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want != nil {
				checkErrors(t, parseErrors(t, tt.data, nil), tt.want)
				return
			}
			cfg := mustParse(t, tt.data, nil)
			if got := cfg.Sources["app_events"].DedupeWindow(); got != tt.window {
				t.Errorf("DedupeWindow() = %v, want %v", got, tt.window)
			}
		})
	}
}
