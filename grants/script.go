package grants

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// Name is a name as the script spells it: an identifier, a string literal
// and, for a database, the argument of \connect; either a quoted name (a
// configuration's) or a psql variable (the generic script).
type Name struct{ Ident, Literal, Connect string }

// Named spells name for the script. It refuses a name that is not UTF-8
// or that holds a control character, such as a newline: psql reads a
// meta-command such as \connect up to the end of its line, so a line
// break in a name would end the command and start a line of the name's
// own, which could be any meta-command, \! and its shell command among
// them.
func Named(name string) (Name, error) {
	if !utf8.ValidString(name) {
		return Name{}, errors.New("not UTF-8, which the script is")
	}
	if i := strings.IndexFunc(name, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(name[i:])
		return Name{}, fmt.Errorf("holds the control character %U, which a psql script cannot hold safely", r)
	}
	return Name{Ident: Ident(name), Literal: pgquote.Literal(name), Connect: connectArg(name)}, nil
}

// connectArg spells the arguments of \connect to database name. The name
// is the dbname of a connection string, as psql would take a name with
// an = or a postgresql:// prefix for one and connect elsewhere; the
// string is in double quotes, within which psql's meta-command lexer
// interprets no backslash, backquote or variable; -reuse-previous=on keeps
// the host, port and user of the connection before, as \connect with a
// plain database name does.
func connectArg(name string) string {
	conninfo := "dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name) + "'"
	return `-reuse-previous=on "` + strings.ReplaceAll(conninfo, `"`, `""`) + `"`
}

// Variable spells the psql variable v.
func Variable(v string) Name {
	return Name{Ident: `:"` + v + `"`, Literal: ":'" + v + "'", Connect: `:"` + v + `"`}
}

// Roles are the names of the roles a script sets up.
type Roles struct {
	Migration, Runtime, Poll, CDC string
}

// DefaultRoles are the role names `tidemark grants` uses unless told
// otherwise.
var DefaultRoles = Roles{Migration: "tidemark_owner", Runtime: "tidemark_run", Poll: "tidemark_poll", CDC: "tidemark_cdc"}

// Plan is what a script sets up.
type Plan struct {
	Migration, Runtime Name
	// Warehouse is the warehouse database; a zero Name leaves \connect out.
	Warehouse Name
	// Encoding, when set, is the client encoding of the names: the
	// script sets it at the start and after each \connect. psql reads the
	// script in the client encoding, which each connection may have
	// otherwise (PGCLIENTENCODING, the server's client_encoding); in some,
	// such as SJIS, the last byte of a UTF-8 letter and the quote after it
	// make one character, and psql would read the rest of the line outside
	// the quotes, a name's \! in it as a meta-command. The names of the
	// generic script are psql variables, which psql quotes in the client
	// encoding: it sets none.
	Encoding string
	// Note is printed below the header, as comment lines.
	Note []string
	// DataSchemas hold mirrors and aggregate tables.
	DataSchemas []Name
	// TableSources are tables of table sources, as schema and table.
	TableSources [][2]Name
	Sources      []SourcePlan
}

// SourcePlan is the part of a script for one poll or CDC source.
type SourcePlan struct {
	// Label names the source in the script's comments.
	Label    string
	Database Name
	Role     Name
	CDC      bool
	Tables   [][2]Name
	// Publication and PublicationTables (an SQL expression of type text
	// listing the tables) are for CDC sources.
	Publication       Name
	PublicationTables string
}

// FromConfig returns the plan for cfg with the given role names. It
// refuses names that Named refuses, each with the configuration key or
// flag that gave it.
func FromConfig(cfg *config.Config, roles Roles) (Plan, error) {
	var n namer
	p := Plan{Migration: n.name("--migration-role", "role", roles.Migration), Runtime: n.name("--runtime-role", "role", roles.Runtime),
		Warehouse: n.database("warehouse.dsn", cfg.Warehouse.DSN), Encoding: "UTF8"}
	seen := map[string]bool{}
	for _, t := range DataTables(cfg) {
		if !seen[t.Schema] {
			seen[t.Schema] = true
			p.DataSchemas = append(p.DataSchemas, n.name(t.Key, "schema", t.Schema))
		}
	}
	for _, name := range cfg.SourceNames() {
		s := cfg.Sources[name]
		key := "sources." + name
		switch {
		case s.Kind() == config.KindTable:
			p.TableSources = append(p.TableSources, n.table(key+".table.name", s.Table.Name))
		case s.Kind() == config.KindPoll:
			p.Sources = append(p.Sources, SourcePlan{Label: key + " (poll)", Database: n.database(key+".poll.dsn", s.Poll.DSN),
				Role: n.name("--poll-role", "role", roles.Poll), Tables: [][2]Name{n.table(key+".poll.table", s.Poll.Table)}})
		case s.Kind() == config.KindCDC:
			sp := SourcePlan{Label: key + " (CDC)", Database: n.database(key+".cdc.dsn", s.CDC.DSN),
				Role: n.name("--cdc-role", "role", roles.CDC), CDC: true,
				Publication: n.name(key+".cdc.publication", "publication", s.CDC.Publication)}
			var list []string
			for _, t := range s.CDC.Tables {
				sp.Tables = append(sp.Tables, n.table(key+".cdc.tables", t))
				schema, table := config.SplitTable(t)
				list = append(list, Ident(schema)+"."+Ident(table))
			}
			sp.PublicationTables = pgquote.Literal(strings.Join(list, ", "))
			p.Sources = append(p.Sources, sp)
		}
	}
	if err := errors.Join(n.errs...); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// namer spells the names of a plan and collects the names it refuses,
// each once.
type namer struct {
	errs []error
	seen map[string]bool
}

// name spells s, the name of a what given by key.
func (n *namer) name(key, what, s string) Name {
	name, err := Named(s)
	if err != nil {
		err = fmt.Errorf("%s: %s name %q: %w", key, what, s, err)
		if !n.seen[err.Error()] {
			if n.seen == nil {
				n.seen = map[string]bool{}
			}
			n.seen[err.Error()] = true
			n.errs = append(n.errs, err)
		}
	}
	return name
}

// table spells the schema and name of table t, "name" or "schema.name".
func (n *namer) table(key, t string) [2]Name {
	schema, table := config.SplitTable(t)
	return [2]Name{n.name(key, "schema", schema), n.name(key, "table", table)}
}

// database spells the database of dsn; a zero Name when dsn names none.
func (n *namer) database(key, dsn string) Name {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil || pc.Database == "" {
		return Name{}
	}
	return n.name(key, "database", pc.Database)
}

// Generic is the plan of deploy/postgres/roles.sql: every name a psql
// variable, one data schema, one poll source and one CDC source of one
// table each.
func Generic() Plan {
	return Plan{
		Note: []string{
			"This is the generic script; every name is a psql variable:",
			"  psql -f roles.sql -v migration_role=tidemark_owner -v runtime_role=tidemark_run \\",
			"    -v warehouse_db=warehouse -v data_schema=public \\",
			"    -v poll_role=tidemark_poll -v poll_db=app -v poll_schema=public -v poll_table=customers \\",
			"    -v cdc_role=tidemark_cdc -v cdc_db=shop -v cdc_schema=public -v cdc_table=orders \\",
			"    -v publication=tidemark_shop",
			"Repeat the data schema, table and source parts for more of them, or leave them out.",
		},
		Migration: Variable("migration_role"), Runtime: Variable("runtime_role"), Warehouse: Variable("warehouse_db"),
		DataSchemas: []Name{Variable("data_schema")},
		Sources: []SourcePlan{
			{Label: "a poll source", Database: Variable("poll_db"), Role: Variable("poll_role"),
				Tables: [][2]Name{{Variable("poll_schema"), Variable("poll_table")}}},
			{Label: "a CDC source", Database: Variable("cdc_db"), Role: Variable("cdc_role"), CDC: true,
				Tables: [][2]Name{{Variable("cdc_schema"), Variable("cdc_table")}}, Publication: Variable("publication"),
				PublicationTables: "format('%I.%I', :'cdc_schema', :'cdc_table')"},
		},
	}
}

// scriptHeader explains the design at the top of every script.
const scriptHeader = `-- Database roles for tidemark, least privilege. Run with psql as a
-- superuser (psql -v ON_ERROR_STOP=1 -f FILE); it is idempotent: run it
-- again after every ` + "`tidemark migrate`" + ` and whenever sources or aggregates change.
-- ` + "`tidemark grants -c tidemark.yaml`" + ` prints it for a configuration.
--
-- Roles:
--   migration role  owns the schemas tidemark and raw and tidemark's state
--                   tables; used by ` + "`tidemark migrate`" + ` only (and by ` + "`tidemark run`" + `
--                   with warehouse.migrate: true, which the runtime role
--                   cannot use: set it to false).
--   runtime role    every other command. SELECT, INSERT, UPDATE, DELETE on
--                   the state tables, SELECT on tidemark.schema_migrations,
--                   no ownership of them: it cannot drop or alter them, nor
--                   the schemas. It creates, and so owns, the tables holding
--                   data: raw.<source> and its partitions (created as event
--                   times arrive, dropped by retention, which needs
--                   ownership), mirrors (columns added as the source gains
--                   them, emptied on a CDC TRUNCATE), aggregate tables and
--                   their __shadow tables (rebuilt and published with DML).
--                   Hence CREATE on raw and on the schemas of mirrors and
--                   aggregates, and TEMPORARY for staging tables.
--                   pg_read_all_stats lets status see the oldest
--                   transaction of other roles.
--   poll role       on a poll source's database: SELECT on the polled table.
--   CDC role        on a CDC source's database: LOGIN REPLICATION (slot
--                   creation and streaming) and SELECT on the tables (initial
--                   snapshot, key checks). tidemark creates a missing
--                   publication, which needs ownership of the tables: this
--                   script creates it instead, as the administrator, so the
--                   CDC role needs no ownership.
-- No role is a superuser or has CREATEROLE or CREATEDB. Passwords are not
-- set here: set them with \password NAME, or use another authentication
-- method, with scram-sha-256 in pg_hba.conf for password logins.
`

// Script renders p as a psql script.
func Script(p Plan) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	encoding := func() {
		if p.Encoding != "" {
			w(`\encoding %s`, p.Encoding)
		}
	}
	w("%s", scriptHeader)
	for _, line := range p.Note {
		w("-- %s", comment(line))
	}
	if len(p.Note) > 0 {
		w("")
	}
	w(`\set ON_ERROR_STOP on`)
	encoding()
	w("")
	w("-- The warehouse database.")
	if p.Warehouse != (Name{}) {
		w(`\connect %s`, p.Warehouse.Connect)
		encoding()
	}
	createRole(w, p.Migration, "LOGIN")
	createRole(w, p.Runtime, "LOGIN")
	w("-- The migration role creates the schemas tidemark and raw if they are missing.")
	w("SELECT format('GRANT CONNECT, CREATE, TEMPORARY ON DATABASE %%I TO %%I', current_database(), %s) \\gexec", p.Migration.Literal)
	w("SELECT format('GRANT CONNECT, TEMPORARY ON DATABASE %%I TO %%I', current_database(), %s) \\gexec", p.Runtime.Literal)
	w("CREATE SCHEMA IF NOT EXISTS tidemark AUTHORIZATION %s;", p.Migration.Ident)
	w("CREATE SCHEMA IF NOT EXISTS raw AUTHORIZATION %s;", p.Migration.Ident)
	w("GRANT USAGE ON SCHEMA tidemark TO %s;", p.Runtime.Ident)
	w("GRANT USAGE, CREATE ON SCHEMA raw TO %s;", p.Runtime.Ident)
	w("-- State tables that later migrations create, and those that exist.")
	w("ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA tidemark GRANT %s ON TABLES TO %s;", p.Migration.Ident, strings.Join(DML, ", "), p.Runtime.Ident)
	quoted := make([]string, len(StateTables))
	for i, t := range StateTables {
		quoted[i] = "'" + t + "'"
	}
	w("SELECT format('GRANT %s ON %%s TO %%I', string_agg('tidemark.' || t, ', '), %s)", strings.Join(DML, ", "), p.Runtime.Literal)
	w("FROM unnest(ARRAY[%s]) AS t", strings.Join(quoted, ", "))
	w("WHERE to_regclass('tidemark.' || t) IS NOT NULL HAVING count(*) > 0 \\gexec")
	w("SELECT format('GRANT SELECT ON tidemark.schema_migrations TO %%1$I; REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON tidemark.schema_migrations FROM %%1$I', %s)",
		p.Runtime.Literal)
	w("WHERE to_regclass('tidemark.schema_migrations') IS NOT NULL \\gexec")
	w("GRANT pg_read_all_stats TO %s;", p.Runtime.Ident)
	if len(p.DataSchemas) > 0 {
		w("-- Schemas of mirrors and aggregate tables: the runtime role creates its tables there.")
	}
	for _, s := range p.DataSchemas {
		w("CREATE SCHEMA IF NOT EXISTS %s AUTHORIZATION %s;", s.Ident, p.Migration.Ident)
		w("GRANT USAGE, CREATE ON SCHEMA %s TO %s;", s.Ident, p.Runtime.Ident)
	}
	if len(p.TableSources) > 0 {
		w("-- Tables of table sources, which the reconciler reads.")
	}
	for _, t := range p.TableSources {
		w("GRANT USAGE ON SCHEMA %s TO %s;", t[0].Ident, p.Runtime.Ident)
		w("GRANT SELECT ON %s.%s TO %s;", t[0].Ident, t[1].Ident, p.Runtime.Ident)
	}
	for _, s := range p.Sources {
		w("")
		w("-- The database of %s, as an administrator of its server.", comment(s.Label))
		if s.Database != (Name{}) {
			w(`\connect %s`, s.Database.Connect)
			encoding()
		}
		attrs := "LOGIN"
		if s.CDC {
			attrs = "LOGIN REPLICATION"
		}
		createRole(w, s.Role, attrs)
		if s.CDC {
			w("ALTER ROLE %s REPLICATION;", s.Role.Ident)
		}
		w("SELECT format('GRANT CONNECT ON DATABASE %%I TO %%I', current_database(), %s) \\gexec", s.Role.Literal)
		for _, t := range s.Tables {
			w("GRANT USAGE ON SCHEMA %s TO %s;", t[0].Ident, s.Role.Ident)
			w("GRANT SELECT ON %s.%s TO %s;", t[0].Ident, t[1].Ident, s.Role.Ident)
		}
		if s.CDC {
			w("-- The publication, created by the tables' owner, so the CDC role need not own them.")
			w("SELECT format('CREATE PUBLICATION %%I FOR TABLE %%s WITH (publish_via_partition_root = true)', %s, %s)",
				s.Publication.Literal, s.PublicationTables)
			w("WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s) \\gexec", s.Publication.Literal)
		}
	}
	return b.String()
}

func createRole(w func(string, ...any), role Name, attrs string) {
	w("SELECT format('CREATE ROLE %%I %s', %s) WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s) \\gexec",
		attrs, role.Literal, role.Literal)
}

// comment makes s safe to write in a -- comment, which a newline or a
// carriage return would end: it writes control characters and bytes that
// are not UTF-8 as Go escapes.
func comment(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case unicode.IsControl(r):
			b.WriteString(strings.Trim(strconv.QuoteRune(r), "'"))
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}
