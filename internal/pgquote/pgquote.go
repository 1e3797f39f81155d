// Package pgquote spells names and strings into the text of SQL
// statements: identifiers quoted as PostgreSQL reads them, and string
// literals, for statements that cannot take their values as parameters
// (DDL, COPY, scripts, replication commands). Every other package quotes
// through it.
package pgquote

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Ident quotes a name, or a qualified name of several parts, as an
// identifier: Ident("raw", "app events") is "raw"."app events".
func Ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Idents quotes each name as an identifier and joins them with commas,
// for a column list.
func Idents(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = Ident(n)
	}
	return strings.Join(q, ", ")
}

// Literal spells s as an SQL string literal that the server and psql read
// the same whether standard_conforming_strings is on or off: with a
// backslash in s it is an escape string, E'...', with the backslash
// doubled, since in '...' with the setting off a backslash would escape
// the quote after it.
func Literal(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		return "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

// CommandLiteral spells s as a string literal of a replication command
// (START_REPLICATION's options, CREATE_REPLICATION_SLOT's): the
// walsender's scanner knows no escape strings and reads a backslash as
// itself, so only the quote is doubled.
func CommandLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
