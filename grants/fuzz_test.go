package grants_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
)

// FuzzScript generates the script of a configuration whose names (roles,
// databases, schemas, tables, a publication, source names) are arbitrary.
// Property: FromConfig refuses the configuration exactly when one of its
// names is not UTF-8 or holds a control character; otherwise, read the
// way psql reads it (checkScript), the script holds no line break or
// other control character of a name, no meta-command but those it means
// (\set ON_ERROR_STOP on, \encoding UTF8, \connect to each database, a
// trailing \gexec), no psql variable, no quote left open at the end of a
// line, and spells each name, which it reads back as given.
func FuzzScript(f *testing.F) {
	f.Add("tidemark_run", "warehouse", "public", "orders", "tidemark_shop", "shop")
	f.Add("tidemark_run", "wh\n\\! touch pwned\n", "public", "orders", "tidemark_shop", "shop")
	f.Add(`\! touch pwned #Á`, `\! touch pwned #\`, `:"x" :'x' :x`, "`touch pwned`", `p" \! x #\`, "s\r\\! touch pwned")
	f.Add(`a'b"c`, `db name='x' host=/tmp`, `Sch"ema`, `t'`, `E'\\'`, "cdc\x00")
	f.Add("r\x85", "postgresql://h/db", "s\xff", "ta.ble", "", "é")
	f.Fuzz(func(t *testing.T, role, database, schema, table, publication, source string) {
		schema = strings.ReplaceAll(schema, ".", "") // the schema of schema.table ends at its first dot
		roles := grants.Roles{Migration: role + "m", Runtime: role + "r", Poll: role + "p", CDC: role + "c"}
		dsn := func(db string) string {
			return "host=h dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'"
		}
		cfg := &config.Config{
			Warehouse: config.Warehouse{DSN: dsn(database + "w")},
			Sources: map[string]*config.Source{
				source + "p": {Poll: &config.PollSource{DSN: dsn(database + "p"), Table: schema + "." + table},
					Mirror: &config.Mirror{Table: schema + "m.m"}},
				source + "c": {CDC: &config.CDCSource{DSN: dsn(database + "c"), Tables: []string{schema + "." + table},
					Publication: publication}},
				source + "t": {Table: &config.TableSource{Name: schema + "t." + table}},
			},
		}
		names := []string{roles.Migration, roles.Runtime, roles.Poll, roles.CDC, schema, table, schema + "m", schema + "t", publication}
		var databases []string
		for _, suffix := range []string{"w", "c", "p"} { // the warehouse, then the sources by name
			if pc, err := pgconn.ParseConfig(dsn(database + suffix)); err == nil && pc.Database != "" {
				databases = append(databases, pc.Database)
			}
		}
		unscriptable := slices.ContainsFunc(append(slices.Clone(names), databases...), func(s string) bool {
			return !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl)
		})
		plan, err := grants.FromConfig(cfg, roles)
		switch {
		case err != nil && !unscriptable:
			t.Fatalf("FromConfig refused names it can spell: %v", err)
		case err == nil && unscriptable:
			t.Fatalf("FromConfig took a name that is not UTF-8 or holds a control character: %q", append(names, databases...))
		case err != nil:
			return
		}
		checkScript(t, grants.Script(plan), names, databases)
	})
}

// checkScript checks FuzzScript's property of script: its lines, read as
// psql's lexer reads them, are comments, blank, the meta-commands the
// generator means, or SQL whose quotes close on the line and whose only
// meta-command is a trailing \gexec; it connects to databases, in order,
// and spells each of names.
func checkScript(t *testing.T, script string, names, databases []string) {
	t.Helper()
	if !utf8.ValidString(script) {
		t.Fatalf("the script is not UTF-8:\n%s", script)
	}
	if i := strings.IndexFunc(script, func(r rune) bool { return r != '\n' && unicode.IsControl(r) }); i >= 0 {
		t.Fatalf("the script holds a control character at byte %d:\n%s", i, script)
	}
	spelled := map[string]bool{}
	var connected []string
	encoded := false // \encoding UTF8 since the last \connect
	for i, line := range strings.Split(strings.TrimSuffix(script, "\n"), "\n") {
		var err error
		switch {
		case line == "" || strings.HasPrefix(line, "--") || line == `\set ON_ERROR_STOP on`:
		case line == `\encoding UTF8`:
			encoded = true
		case strings.HasPrefix(line, `\connect -reuse-previous=on `):
			var db string
			db, err = connectArgument(strings.TrimPrefix(line, `\connect -reuse-previous=on `))
			connected = append(connected, db)
			encoded = false
		case strings.HasPrefix(line, `\`):
			err = errors.New("a meta-command the generator does not write")
		case !encoded:
			err = errors.New("SQL before \\encoding UTF8")
		default:
			err = sqlLine(line, spelled)
		}
		if err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
	}
	if !slices.Equal(connected, databases) {
		t.Errorf("the script connects to %q, want %q", connected, databases)
	}
	for _, name := range names {
		if !spelled[name] {
			t.Errorf("no identifier or literal of the script reads %q", name)
		}
	}
}

// connectArgument reads the argument of \connect as psql does: double
// quoted text, which psql copies as it is, with "" for ", and then as
// libpq reads the connection string dbname='...', with \ escaping the
// next character. It returns the database name.
func connectArgument(arg string) (string, error) {
	if !strings.HasPrefix(arg, `"`) {
		return "", errors.New("the argument of \\connect is not in double quotes")
	}
	var conninfo strings.Builder
	rest := arg[1:]
	for {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			return "", errors.New("unterminated double quotes")
		}
		conninfo.WriteString(rest[:i])
		rest = rest[i+1:]
		if !strings.HasPrefix(rest, `"`) {
			break
		}
		conninfo.WriteByte('"')
		rest = rest[1:]
	}
	if rest != "" {
		return "", fmt.Errorf("%q after the argument of \\connect", rest)
	}
	s, ok := strings.CutPrefix(conninfo.String(), "dbname='")
	if !ok {
		return "", fmt.Errorf("connection string %q is not dbname='...'", conninfo.String())
	}
	var db strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 == len(s) {
				return "", errors.New("a backslash ends the connection string")
			}
			i++
			db.WriteByte(s[i])
		case '\'':
			if i != len(s)-1 {
				return "", fmt.Errorf("%q after the dbname of the connection string", s[i+1:])
			}
			return db.String(), nil
		default:
			db.WriteByte(s[i])
		}
	}
	return "", errors.New("unterminated dbname in the connection string")
}

// sqlLine reads a line of SQL as psql's lexer does and adds the names it
// spells (unquoted identifiers, quoted identifiers, string literals) to
// spelled. Outside quotes it refuses what psql would act on or what would
// change how it reads the rest: a backslash other than a trailing \gexec
// (a meta-command), a colon (a variable), a dollar sign starting a token
// (a dollar quote), a comment, a letter before a quote other than E' and
// any non-ASCII character. A literal '...' may not hold a backslash, which
// with standard_conforming_strings off escapes the quote after it.
func sqlLine(line string, spelled map[string]bool) error {
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == '\'', c == '"':
			v, n, err := quoted(line[i:], c, false)
			if err != nil {
				return err
			}
			if c == '\'' && strings.Contains(line[i:i+n], `\`) {
				return errors.New("a backslash in a literal '...'")
			}
			spelled[v] = true
			i += n
		case c == '\\':
			if line[i:] != `\gexec` || i == 0 || line[i-1] != ' ' {
				return fmt.Errorf("meta-command at byte %d", i)
			}
			return nil
		case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			j := i + 1
			for j < len(line) && (line[j] == '_' || line[j] == '$' || 'a' <= line[j] && line[j] <= 'z' ||
				'A' <= line[j] && line[j] <= 'Z' || '0' <= line[j] && line[j] <= '9') {
				j++
			}
			word := line[i:j]
			if j < len(line) && (line[j] == '\'' || line[j] == '"' || line[j] == '&') {
				if word != "E" || line[j] != '\'' {
					return fmt.Errorf("%s%c at byte %d", word, line[j], i)
				}
				v, n, err := quoted(line[j:], '\'', true)
				if err != nil {
					return err
				}
				spelled[v] = true
				j += n
			} else {
				spelled[word] = true
			}
			i = j
		case c == ':', c == '$', c == '`', c == '&', c >= utf8.RuneSelf:
			return fmt.Errorf("%q outside quotes at byte %d", c, i)
		case strings.HasPrefix(line[i:], "--"), strings.HasPrefix(line[i:], "/*"):
			return fmt.Errorf("a comment at byte %d", i)
		default:
			i++
		}
	}
	return nil
}

// quoted reads the quoted text at the start of s, quoted by q, doubled
// within it; escapes reads \\ and \' in it as in an escape string. It
// returns the text and the length of its spelling.
func quoted(s string, q byte, escapes bool) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch {
		case escapes && s[i] == '\\':
			if i+1 == len(s) || (s[i+1] != '\\' && s[i+1] != '\'') {
				return "", 0, fmt.Errorf("an escape other than \\\\ and \\' in %s", s)
			}
			i++
			b.WriteByte(s[i])
		case s[i] == q && i+1 < len(s) && s[i+1] == q:
			i++
			b.WriteByte(q)
		case s[i] == q:
			return b.String(), i + 1, nil
		default:
			b.WriteByte(s[i])
		}
	}
	return "", 0, fmt.Errorf("%c left open at the end of the line", q)
}
