package pgjson_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// jsonbTakes asks PostgreSQL whether jsonb takes the json value s; the
// test fails if json does not take it.
func jsonbTakes(t *testing.T, pool *pgxpool.Pool, s string) bool {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT $1::text::json", s); err != nil {
		t.Fatalf("json refuses %.60q: %v", s, err)
	}
	_, err := pool.Exec(ctx, "SELECT $1::text::jsonb", s)
	return err == nil
}

// TestJSONBTakes: for json values around each limit, JSONBTakes agrees
// with PostgreSQL's jsonb input.
func TestJSONBTakes(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	cases := []string{
		`{}`, `[]`, `null`, `true`, `"plain"`, `{"a": [1, 2.5, -3e2, "x"]}`, `{"a":1,"a":2}`,
		`"\u0000"`, `{"k\u0000": 1}`, `"a\\u0000"`, `"\u0001"`, `"\u00e9"`,
		`"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\ud800"`, `"\udc00"`, `"\ud800x"`, `"\ud800\ud800"`,
		`"\ud800\u0041"`, `"\ud800\n"`, `["\udfff"]`, `{"\ud800": 1}`,
		`0`, `-0`, `0.0`, `1e1000`, `1e1001`, `-1e-1001`, `1E+1000`, `1e01000`,
		`1e131071`, `9e131071`, `1e131072`, `0.1e131072`, `0.01e131073`, `1e-16383`, `1e-16384`,
		`1.5e-16383`, `0.5e-16382`, `10e-16384`, `1.50e-16382`, `1.5e-16382`,
		`0e131072`, `0e999999999`, `0e1073741822`, `0e1073741823`, `-0.00E+1073741823`, `0e-1073741823`, `0e-16383`, `0e-16384`,
		`0.0e-16383`, `1e2147483647`, `1e99999999999999999999`, `0e00000000000000000001`, `1e-0000000000000000000001`,
		`[1e131072, "ok"]`, `{"n": 1e-20000}`,
		"1" + strings.Repeat("0", 131071), "1" + strings.Repeat("0", 131072),
		"0." + strings.Repeat("0", 16382) + "1", "0." + strings.Repeat("0", 16383) + "1",
		"0." + strings.Repeat("0", 16383), "0." + strings.Repeat("0", 16384),
		strings.Repeat("0", 1) + "." + strings.Repeat("9", 16383) + "e131072",
	}
	// Numbers around the weight and scale limits, with digits before and
	// after the point.
	for _, m := range []string{"1", "12345", "0.001", "99.99", "0.00000", "-7.5"} {
		for _, e := range []string{"131068", "131069", "131070", "131071", "131072", "-16379", "-16380", "-16381", "-16382", "-16383"} {
			cases = append(cases, m+"e"+e)
		}
	}
	// PostgreSQL 16 and later also take a zero with the exponent 2^30-1
	// (14 and 15 refuse it); JSONBTakes refuses what any supported
	// version refuses, so that a value is stored alike on every version.
	var version int
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	onlySince16 := map[string]bool{`0e1073741823`: true, `-0.00E+1073741823`: true}
	for _, s := range cases {
		takes, got := jsonbTakes(t, pool, s), pgjson.JSONBTakes(s)
		switch {
		case onlySince16[s] && takes != (version >= 160000):
			t.Errorf("PostgreSQL %d's jsonb takes %q: %v, want %v", version, s, takes, version >= 160000)
		case onlySince16[s] && got:
			t.Errorf("JSONBTakes(%q) = true, want false: PostgreSQL 14 and 15 refuse it", s)
		case !onlySince16[s] && got != takes:
			t.Errorf("JSONBTakes(%.60q) = %v, PostgreSQL %d's jsonb says %v", s, got, version, takes)
		}
	}
	for _, s := range []string{``, `{`, `"\ud800`, `01`, `{"a" 1}`, `nul`} {
		if pgjson.JSONBTakes(s) {
			t.Errorf("JSONBTakes(%q) = true for text that is not JSON", s)
		}
	}
}
