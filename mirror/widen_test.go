package mirror

import "testing"

// TestWiden: what a mirror column becomes to hold what a source's schema
// now declares.
func TestWiden(t *testing.T) {
	tests := []struct {
		have string
		v    Values
		to   string
		safe bool
	}{
		{"integer", Values{Type: "integer"}, "", false},
		{"integer", Values{Type: "bigint"}, "bigint", true},
		{"smallint", Values{Type: "integer"}, "integer", true},
		{"bigint", Values{Type: "smallint"}, "", false},
		{"real", Values{Type: "double precision"}, "double precision", true},
		{"double precision", Values{Type: "real"}, "", false},
		{"numeric(10,2)", Values{Type: "numeric", Precision: 12, Scale: 2}, "numeric(12,2)", true},
		{"numeric(10,2)", Values{Type: "numeric", Precision: 10, Scale: 4}, "numeric(12,4)", true},
		{"numeric(10,2)", Values{Type: "numeric", Precision: 8, Scale: 1}, "", false},
		{"numeric(10,2)", Values{Type: "numeric"}, "", false},
		{"numeric(10,2)", Values{Type: "bigint"}, "numeric(21,2)", true},
		{"numeric(30,2)", Values{Type: "bigint"}, "", false},
		{"numeric(10,2)", Values{Type: "double precision"}, "numeric", false},
		{"numeric(999,0)", Values{Type: "numeric", Precision: 20, Scale: 10}, "numeric", true},
		{"numeric", Values{Type: "double precision"}, "", false},
		{"character varying(10)", Values{Type: "text", Length: 20}, "character varying(20)", true},
		{"character varying(10)", Values{Type: "text", Length: 5}, "", false},
		{"character varying(10)", Values{Type: "text"}, "", false},
		{"integer", Values{Type: "numeric", Precision: 12, Scale: 2}, "numeric(12,2)", false},
		{"integer", Values{Type: "numeric", Precision: 9}, "", false},
		{"integer", Values{Type: "double precision"}, "double precision", false},
		{"text", Values{Type: "bigint"}, "", false},
		{"jsonb", Values{Type: "text"}, "", false},
		{"timestamp without time zone", Values{Type: "timestamptz"}, "", false},
	}
	for _, tt := range tests {
		to, safe := Widen(tt.have, tt.v)
		if to != tt.to || safe != tt.safe {
			t.Errorf("Widen(%q, %+v) = %q, %v; want %q, %v", tt.have, tt.v, to, safe, tt.to, tt.safe)
		}
	}
}
