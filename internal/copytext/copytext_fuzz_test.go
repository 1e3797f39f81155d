package copytext

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// invalidText is the SQLSTATE of text PostgreSQL does not take: a NUL
// byte or a byte sequence that is not UTF-8.
const invalidText = "22021"

// copyFuzzMaxLen bounds the bytes of each text of a FuzzCopyRows input;
// copyFuzzTimeout bounds the database work of one input.
const (
	copyFuzzMaxLen  = 64
	copyFuzzTimeout = 20 * time.Second
)

// copyFuzzFrom and copyFuzzTo bound the commit times FuzzCopyRows writes:
// the years PostgreSQL and the encoder's four-digit years share.
var (
	copyFuzzFrom = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	copyFuzzTo   = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()
)

// FuzzCopyRows writes one row with Rows and COPY into a table of a
// real PostgreSQL, on one connection, and reads it back. The row holds a
// text field, a value (NULL or text), a field from bytes (NULL for nil), a
// timestamptz and a text[] of names (split at "|"). Property: when every
// text is valid UTF-8 without NUL bytes, PostgreSQL stores exactly the
// values written (NULL as NULL, the time to the microsecond, truncated);
// otherwise, as PostgreSQL never prints such text, the COPY fails with
// SQLSTATE 22021 and the connection stays usable. Tabs, newlines, carriage
// returns, backslashes, \N and \. lines arrive as they were written.
//
// Each input costs a few round trips to the server, and the fuzzer
// minimizes every new interesting input with up to quadratically many
// tries in its length: an input of a few kilobytes keeps the worker
// minimizing, with no new executions counted, for the whole of
// -fuzzminimizetime (60s by default). The encoder escapes byte by byte, so
// a long input finds nothing that a short one cannot: inputs with a text
// longer than copyFuzzMaxLen are not run. Each input has copyFuzzTimeout,
// so a server that stops answering fails the input instead of stalling
// the fuzzer.
func FuzzCopyRows(f *testing.F) {
	pool, _ := pgtest.NewPool(f)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(conn.Release)
	if _, err := conn.Exec(ctx, "CREATE TEMP TABLE fuzz_copy (a text, b text, c text, d timestamptz, e text[])"); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a string, b []byte, null bool, sec, nsec int64, names string) {
		if len(a) > copyFuzzMaxLen || len(b) > copyFuzzMaxLen || len(names) > copyFuzzMaxLen {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, copyFuzzTimeout)
		defer cancel()
		span := copyFuzzTo - copyFuzzFrom
		at := time.Unix(copyFuzzFrom+((sec-copyFuzzFrom)%span+span)%span, ((nsec%1e9)+1e9)%1e9)
		var list []string
		if names != "" {
			list = strings.Split(names, "|")
		}
		w := New()
		defer w.Release()
		w.Text(a)
		bs := string(b)
		if null {
			w.Value(nil)
		} else {
			w.Value(&bs)
		}
		w.Bytes(b)
		w.Time(at)
		w.TextArray(list)
		w.End()

		valid := validText(a) && validText(bs)
		for _, n := range list {
			valid = valid && validText(n)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Conn().PgConn().CopyFrom(ctx, w.Data(), "COPY pg_temp.fuzz_copy FROM STDIN")
		if !valid {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != invalidText {
				t.Fatalf("COPY of invalid text %q: got %v, want SQLSTATE %s", w.Data().String(), err, invalidText)
			}
			_ = tx.Rollback(ctx)
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatalf("connection after a failed COPY: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("COPY %q: %v", w.Data().String(), err)
		}
		var (
			ga     string
			gb, gc *string
			gd     time.Time
			ge     []string
		)
		if err := tx.QueryRow(ctx, "SELECT a, b, c, d, e FROM pg_temp.fuzz_copy").Scan(&ga, &gb, &gc, &gd, &ge); err != nil {
			t.Fatalf("read back %q: %v", w.Data().String(), err)
		}
		check := func(what string, got *string, want string, isNull bool) {
			t.Helper()
			switch {
			case isNull && got != nil:
				t.Fatalf("%s: got %q, want NULL (COPY data %q)", what, *got, w.Data().String())
			case !isNull && (got == nil || *got != want):
				t.Fatalf("%s: got %v, want %q (COPY data %q)", what, got, want, w.Data().String())
			}
		}
		check("text", &ga, a, false)
		check("value", gb, bs, null)
		check("bytes", gc, bs, b == nil)
		if want := at.Truncate(time.Microsecond); !gd.Equal(want) {
			t.Fatalf("time: got %s, want %s (COPY data %q)", gd.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano), w.Data().String())
		}
		if len(ge) != len(list) || (list != nil) != (ge != nil) {
			t.Fatalf("text[]: got %q, want %q (COPY data %q)", ge, list, w.Data().String())
		}
		for i := range list {
			if ge[i] != list[i] {
				t.Fatalf("text[]: got %q, want %q (COPY data %q)", ge, list, w.Data().String())
			}
		}
	})
}

// validText reports whether PostgreSQL takes s as text.
func validText(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }
