package mirror

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// keySide builds the statements of one database, the source or the
// mirror, whose rows are aliased m.
type keySide struct {
	table    string   // quoted, qualified name
	names    []string // quoted key column names in key order
	bytewise []bool   // the column orders bytewise as it is
	types    []string // the key columns' types
	keyText  string   // KeyText of m
	live     string   // the rows compared
	// indexable is true when the key's index serves bytewise range
	// predicates: every key column orders bytewise and a btree index
	// leads with the key columns in key order.
	indexable bool
}

// newKeySide reads how the key columns of table collate and whether an
// index serves their ranges, and builds the statements of that side.
func newKeySide(ctx context.Context, tx pgx.Tx, table pgx.Identifier, key, types []string, live string) (*keySide, error) {
	rows, err := tx.Query(ctx, keyCollationSQL, table.Sanitize(), key)
	if err != nil {
		return nil, fmt.Errorf("read the key's collations: %w", err)
	}
	type keyCollation struct {
		name                 string
		collatable, bytewise bool
	}
	colls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyCollation, error) {
		var c keyCollation
		return c, r.Scan(&c.name, &c.collatable, &c.bytewise)
	})
	if err != nil {
		return nil, fmt.Errorf("read the key's collations: %w", err)
	}
	if len(colls) != len(key) {
		return nil, fmt.Errorf("the table does not exist or lacks key columns (%s)", strings.Join(key, ", "))
	}
	s := &keySide{table: table.Sanitize(), types: types, keyText: KeyText("m", key), live: live}
	if err := tx.QueryRow(ctx, keyIndexSQL, s.table, key).Scan(&s.indexable); err != nil {
		return nil, fmt.Errorf("read the key's index: %w", err)
	}
	for i, name := range key {
		s.names = append(s.names, pgquote.Ident(name))
		s.bytewise = append(s.bytewise, colls[i].bytewise)
		s.indexable = s.indexable && colls[i].bytewise
	}
	return s, nil
}

// cols returns the key columns of the rows aliased alias.
func (s *keySide) cols(alias string) []string {
	out := make([]string, len(s.names))
	for i, n := range s.names {
		out[i] = alias + "." + n
	}
	return out
}

// cmp returns the key columns of alias as compared and ordered: bytewise.
func (s *keySide) cmp(alias string) []string {
	out := s.cols(alias)
	for i := range out {
		if !s.bytewise[i] {
			out[i] += ` COLLATE "C"`
		}
	}
	return out
}

// aliased returns the key columns of m as tm_k1..n.
func (s *keySide) aliased() string {
	out := s.cols("m")
	for i := range out {
		out[i] += fmt.Sprintf(" AS tm_k%d", i+1)
	}
	return strings.Join(out, ", ")
}

// where is the predicate of a range; its bounds are parameters from $first
// on, cast from text to the key columns' types.
func (s *keySide) where(rg keyRange, first int) (string, []any) {
	parts := []string{s.live}
	var args []any
	bound := func(op string, vals []string) {
		params := make([]string, len(vals))
		for i, v := range vals {
			params[i] = fmt.Sprintf("$%d::%s", first+len(args), s.types[i])
			args = append(args, v)
		}
		parts = append(parts, row(s.cmp("m"))+" "+op+" "+row(params))
	}
	if rg.lo != nil {
		bound(">=", rg.lo)
	}
	if rg.hi != nil {
		bound("<", rg.hi)
	}
	return strings.Join(parts, " AND "), args
}

// row is a row constructor of several expressions, or the one expression.
func row(exprs []string) string {
	if len(exprs) == 1 {
		return exprs[0]
	}
	return "(" + strings.Join(exprs, ", ") + ")"
}

func (s *keySide) count(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	return fmt.Sprintf(keyCountSQL, s.table, pred), args
}

func (s *keySide) checksum(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	return fmt.Sprintf(keyChecksumSQL, s.table, pred, s.keyText), args
}

func (s *keySide) tiles(rg keyRange, step int64) (string, []any) {
	pred, args := s.where(rg, 2)
	firsts := make([]string, len(s.names))
	for i := range firsts {
		firsts[i] = fmt.Sprintf("max(CASE WHEN (q.tm_rn - 1) %% $1 = 0 THEN q.tm_k%d::text END)", i+1)
	}
	sql := fmt.Sprintf(keyTilesSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.keyText,
		s.aliased(), strings.Join(firsts, ", "))
	return sql, append([]any{step}, args...)
}

func (s *keySide) sample(percent float32, ranges int) (string, []any) {
	pred, args := s.where(keyRange{}, 3)
	texts := make([]string, len(s.names))
	for i := range texts {
		texts[i] = fmt.Sprintf("q.tm_k%d::text", i+1)
	}
	sql := fmt.Sprintf(keySampleSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.aliased(), strings.Join(texts, ", "))
	return sql, append([]any{percent, int64(ranges)}, args...)
}

// buckets computes the sums of adjacent ranges in one pass (see
// keyBucketsSQL).
func (s *keySide) buckets(ranges []keyRange) (string, []any) {
	union := keyRange{lo: ranges[0].lo, hi: ranges[len(ranges)-1].hi}
	pred, args := s.where(union, 1)
	bounds := make([]keyFound, 0, len(ranges)-1)
	for _, rg := range ranges[1:] {
		bounds = append(bounds, keyFound{cols: rg.lo})
	}
	unnest, aliases, _ := s.unnest(len(args) + 1)
	casts := make([]string, len(s.names))
	for i := range casts {
		casts[i] = fmt.Sprintf("u.tm_k%d::%s", i+1, s.types[i])
	}
	cmp := make([]string, len(s.names))
	for i := range cmp {
		cmp[i] = fmt.Sprintf("b.tm_k%d", i+1)
		if !s.bytewise[i] {
			cmp[i] += ` COLLATE "C"`
		}
	}
	sql := fmt.Sprintf(keyBucketsSQL, s.table, pred, s.keyText, s.aliased(), strings.Join(cmp, ", "),
		unnest, strings.Join(casts, ", "), aliases)
	return sql, append(args, columnArrays(bounds, len(s.names))...)
}

func (s *keySide) stream(rg keyRange) (string, []any) {
	pred, args := s.where(rg, 1)
	cols := s.cols("m")
	for i := range cols {
		cols[i] += "::text"
	}
	return fmt.Sprintf(keyStreamSQL, s.table, pred, strings.Join(s.cmp("m"), ", "), s.keyText, strings.Join(cols, ", ")), args
}

// unnest returns the arguments of unnest for one text array per key
// column from $first on, their column aliases and the match of m against
// them.
func (s *keySide) unnest(first int) (args, aliases, match string) {
	a := make([]string, len(s.names))
	al := make([]string, len(s.names))
	m := make([]string, len(s.names))
	for i, c := range s.cols("m") {
		a[i] = fmt.Sprintf("$%d::text[]", first+i)
		al[i] = fmt.Sprintf("tm_k%d", i+1)
		m[i] = fmt.Sprintf("%s = u.tm_k%d::%s", c, i+1, s.types[i])
	}
	return strings.Join(a, ", "), strings.Join(al, ", "), strings.Join(m, " AND ")
}

func (s *keySide) absent() string {
	args, aliases, match := s.unnest(2)
	return fmt.Sprintf(keyAbsentSQL, s.table, "$1::text[], "+args, aliases, match)
}

// remove flags (soft) or deletes (hard) the mirror rows of the given keys.
func (s *keySide) remove(t *Table) string {
	if t.Hard {
		args, aliases, match := s.unnest(1)
		return fmt.Sprintf(keyRemoveSQL, s.table, args, aliases, match)
	}
	args, aliases, match := s.unnest(2)
	return fmt.Sprintf(keyFlagSQL, s.table, pgquote.Ident(t.DeletedColumn), args, aliases, match)
}
