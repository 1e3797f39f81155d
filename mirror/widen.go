package mirror

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// A mirror whose columns a source's schema declares (a Debezium source's)
// follows the widening of a column at the source: an integer becoming a
// wider integer, a float a double, a decimal gaining digits, a varchar
// length. Anything else the mirror's column cannot hold is for the
// operator to alter.

// Values is what a column must hold, as a source's schema declares it.
type Values struct {
	// Type is the PostgreSQL type the schema maps to (smallint, integer,
	// bigint, real, double precision, numeric, text, ...).
	Type string
	// Precision and Scale are a decimal's, Length a string's, when the
	// schema says; 0 otherwise.
	Precision, Scale, Length int
}

// maxNumericPrecision is the largest precision a numeric(p,s) takes.
const maxNumericPrecision = 1000

var (
	numericTypeRe = regexp.MustCompile(`^numeric\((\d+),(\d+)\)$`)
	varcharTypeRe = regexp.MustCompile(`^character varying\((\d+)\)$`)
)

// integerDigits and integerRank order the integer types.
var (
	integerDigits = map[string]int{"smallint": 5, "integer": 10, "bigint": 19}
	floatRank     = map[string]int{"real": 1, "double precision": 2}
)

// Widen says how a mirror column of type have (as format_type prints it)
// must change to hold the values v declares: to is the type to alter it
// to, "" when it holds them or tidemark cannot tell (values it refuses are
// then dead letters). safe reports a widening tidemark makes itself: to a
// wider integer or float, a numeric with more digits, a longer varchar.
// Otherwise (an integer column for decimals or floats, a numeric column
// for floats) the operator alters the column: its existing values would
// change, or its type is theirs to choose.
func Widen(have string, v Values) (to string, safe bool) {
	switch {
	case integerDigits[have] > 0 && integerDigits[v.Type] > 0:
		if integerDigits[v.Type] > integerDigits[have] {
			return v.Type, true
		}
	case floatRank[have] > 0 && floatRank[v.Type] > 0:
		if floatRank[v.Type] > floatRank[have] {
			return v.Type, true
		}
	case integerDigits[have] > 0 && (floatRank[v.Type] > 0 || v.Type == "numeric"):
		if v.Type == "numeric" && v.Precision > 0 && v.Scale == 0 && v.Precision <= integerDigits[have]-1 {
			return "", false // whole numbers the column holds
		}
		return numericOf(v), false
	case numericTypeRe.MatchString(have):
		m := numericTypeRe.FindStringSubmatch(have)
		p, _ := strconv.Atoi(m[1])
		s, _ := strconv.Atoi(m[2])
		var wp, ws int // the declared values' integer digits and scale
		switch {
		case integerDigits[v.Type] > 0:
			wp = integerDigits[v.Type]
		case v.Type == "numeric" && v.Precision > 0:
			wp, ws = v.Precision-v.Scale, v.Scale
		case floatRank[v.Type] > 0:
			return "numeric", false
		default:
			return "", false
		}
		digits, scale := max(p-s, wp), max(s, ws)
		if digits+scale > p || scale > s {
			if digits+scale > maxNumericPrecision {
				return "numeric", true
			}
			return fmt.Sprintf("numeric(%d,%d)", digits+scale, scale), true
		}
	case varcharTypeRe.MatchString(have):
		n, _ := strconv.Atoi(varcharTypeRe.FindStringSubmatch(have)[1])
		if v.Type == "text" && v.Length > n {
			return fmt.Sprintf("character varying(%d)", v.Length), true
		}
	}
	return "", false
}

// numericOf is the numeric type of the values v declares.
func numericOf(v Values) string {
	if v.Type == "numeric" && v.Precision > 0 && v.Precision <= maxNumericPrecision {
		return fmt.Sprintf("numeric(%d,%d)", v.Precision, v.Scale)
	}
	if floatRank[v.Type] > 0 {
		return v.Type
	}
	return "numeric"
}

// AlterTypesSQL is the statement that alters the columns of target to the
// types of to, by column name.
func AlterTypesSQL(target pgx.Identifier, to map[string]string) string {
	names := make([]string, 0, len(to))
	for n := range to {
		names = append(names, n)
	}
	sort.Strings(names)
	clauses := make([]string, len(names))
	for i, n := range names {
		clauses[i] = fmt.Sprintf("ALTER COLUMN %s TYPE %s", pgquote.Ident(n), to[n])
	}
	return fmt.Sprintf("ALTER TABLE %s %s", target.Sanitize(), strings.Join(clauses, ", "))
}

// AlterTypes alters the columns of target to the types of to, in one
// statement under the mirror's DDL lock. Widening an integer or a float
// rewrites the table (a numeric or varchar gaining digits does not),
// holding it locked meanwhile.
func AlterTypes(ctx context.Context, conn *pgx.Conn, target pgx.Identifier, to map[string]string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockDDLSQL, target.Sanitize()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, AlterTypesSQL(target, to)); err != nil {
			return fmt.Errorf("widen the columns of %s: %w", target.Sanitize(), err)
		}
		return nil
	})
}
