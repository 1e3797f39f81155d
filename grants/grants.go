// Package grants knows which database privileges each role tidemark uses
// needs, checks them before a command starts, and prints the SQL that
// grants them.
//
// tidemark connects with up to four kinds of role:
//
//   - the migration role (`tidemark migrate`, and `tidemark run` with
//     warehouse.migrate: true) owns the schemas tidemark and raw and
//     tidemark's state tables;
//   - the runtime role (warehouse.dsn of every other command) reads and
//     writes the state tables without owning them, and owns the data
//     tables it creates: raw tables and their partitions, mirrors and
//     aggregate tables, which it needs to own to create and drop
//     partitions, add mirror columns and empty mirrors;
//   - a poll source's role (sources.<name>.poll.dsn) reads the polled
//     table;
//   - a CDC source's role (sources.<name>.cdc.dsn) replicates and reads the
//     published tables; the publication is created beforehand by the
//     tables' owner, since creating one needs their ownership.
//
// Requirements lists what a configuration needs of each; Check reports
// every requirement the connected role lacks at once, each with the
// statement that grants it; Script renders the whole setup as a psql
// script. With a single role that owns everything, as tidemark sets up
// by default, every check passes.
package grants

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/raw"
)

// StateTables are tidemark's state tables in schema tidemark, besides
// schema_migrations: the runtime role reads and writes them. A migration
// that adds a table adds it here (a test compares the list with the
// migrated schema).
var StateTables = []string{
	"backfill_chunks", "backfill_runs", "cdc_gaps", "cdc_positions", "cdc_resync_keys", "cdc_resyncs", "corrections", "dead_letters", "debezium_truncates",
	"event_ids", "ingest_ledger", "kafka_offsets", "key_reconciliations", "load_watermarks", "partition_arrivals",
	"partitions", "pending_partitions", "poll_watermarks", "raw_retention", "shadow_builds", "source_pauses",
	"source_watermarks", "verify_runs",
}

// DML are the privileges the runtime role holds on every state table.
var DML = []string{"SELECT", "INSERT", "UPDATE", "DELETE"}

// Kind is the kind of object a requirement is about.
type Kind int

// Kinds of requirement.
const (
	Database    Kind = iota // a privilege on the connected database
	Schema                  // a privilege on a schema
	Table                   // a privilege on a table
	Owner                   // ownership of a table
	Replication             // the REPLICATION attribute of the role
	Publication             // a publication that must exist (the role cannot create it)
)

// Requirement is one privilege a role needs.
type Requirement struct {
	// Key is the configuration key of the connection it is needed on,
	// such as warehouse.dsn or sources.shop.cdc.dsn.
	Key string
	// Role says whose requirement it is, for messages: "warehouse" or
	// the source's kind ("poll source", "CDC source").
	Role string
	Kind Kind
	// Schema and Name identify the object: a schema (Name empty), a table
	// or a publication (Name only).
	Schema, Name string
	// Privilege is the privilege, for Database, Schema and Table.
	Privilege string
	// Why says what needs it, for ownership and publications.
	Why string
	// Tables are a publication's tables, for its CREATE statement.
	Tables []string
	// IfMissing, a table of Schema, applies a schema privilege only
	// while that table is missing: CREATE where a table is to be
	// created, which an existing table no longer needs.
	IfMissing string
	// IfExists applies the requirement only when the object exists
	// (ownership of a data table that tidemark creates if missing).
	IfExists bool
}

// object is the requirement's object as SQL.
func (r Requirement) object() string {
	switch r.Kind {
	case Schema:
		return Ident(r.Schema)
	case Table, Owner:
		return Ident(r.Schema) + "." + Ident(r.Name)
	case Publication:
		return Ident(r.Name)
	}
	return ""
}

// Fix returns the statement that gives role what r requires.
func (r Requirement) Fix(role string) string {
	switch r.Kind {
	case Database:
		return fmt.Sprintf("GRANT %s ON DATABASE %s TO %s", r.Privilege, Ident(r.Schema), Ident(role))
	case Schema:
		return fmt.Sprintf("GRANT %s ON SCHEMA %s TO %s", r.Privilege, r.object(), Ident(role))
	case Table:
		return fmt.Sprintf("GRANT %s ON %s TO %s", r.Privilege, r.object(), Ident(role))
	case Owner:
		return fmt.Sprintf("ALTER TABLE %s OWNER TO %s", r.object(), Ident(role))
	case Replication:
		return fmt.Sprintf("ALTER ROLE %s REPLICATION", Ident(role))
	case Publication:
		return fmt.Sprintf("as the owner of the tables, CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)",
			r.object(), strings.Join(r.Tables, ", "))
	}
	return ""
}

// lacks describes what role lacks.
func (r Requirement) lacks(role string) string {
	who := fmt.Sprintf("the %s role %q", r.Role, role)
	switch r.Kind {
	case Database:
		return fmt.Sprintf("%s lacks %s on database %s", who, r.Privilege, Ident(r.Schema))
	case Schema:
		s := fmt.Sprintf("%s lacks %s on schema %s", who, r.Privilege, r.object())
		if r.IfMissing != "" {
			s += ", which it needs to create " + r.object() + "." + Ident(r.IfMissing)
		}
		return s
	case Table:
		return fmt.Sprintf("%s lacks %s on %s", who, r.Privilege, r.object())
	case Owner:
		return fmt.Sprintf("%s does not own %s, which it must to %s", who, r.object(), r.Why)
	case Replication:
		return fmt.Sprintf("%s lacks REPLICATION", who)
	case Publication:
		return fmt.Sprintf("publication %s does not exist, and %s cannot create it (that needs ownership of the tables)", r.object(), who)
	}
	return who
}

// ErrMissing is wrapped by the error of Check when privileges are missing.
var ErrMissing = errors.New("missing privileges")

// MissingError lists every privilege a role lacks.
type MissingError struct {
	// Problems are one line each: who lacks what, and the statement that
	// grants it.
	Problems []string
}

// Error lists the problems, one a line.
func (e *MissingError) Error() string {
	return fmt.Sprintf("%d missing privilege(s):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Unwrap makes errors.Is(err, ErrMissing) true.
func (e *MissingError) Unwrap() error { return ErrMissing }

// Warehouse returns what the runtime role needs in the warehouse for cfg:
// connecting and temporary tables; reading and writing the state tables;
// creating tables in raw and in the schemas of mirrors and aggregates, and
// owning those it created; reading table sources. database is the
// warehouse database's name.
func Warehouse(cfg *config.Config, database string) []Requirement {
	const key, role = "warehouse.dsn", "warehouse"
	var out []Requirement
	add := func(r Requirement) {
		r.Key, r.Role = key, role
		out = append(out, r)
	}
	for _, p := range []string{"CONNECT", "TEMPORARY"} {
		add(Requirement{Kind: Database, Schema: database, Privilege: p})
	}
	add(Requirement{Kind: Schema, Schema: "tidemark", Privilege: "USAGE"})
	add(Requirement{Kind: Table, Schema: "tidemark", Name: "schema_migrations", Privilege: "SELECT"})
	for _, t := range StateTables {
		for _, p := range DML {
			add(Requirement{Kind: Table, Schema: "tidemark", Name: t, Privilege: p})
		}
	}
	add(Requirement{Kind: Schema, Schema: raw.Schema, Privilege: "USAGE"})
	add(Requirement{Kind: Schema, Schema: raw.Schema, Privilege: "CREATE"})
	for _, name := range cfg.SourceNames() {
		s := cfg.Sources[name]
		if s.Kind() != config.KindTable {
			add(Requirement{Kind: Owner, Schema: raw.Schema, Name: name, IfExists: true, Why: "create and drop its partitions"})
		}
	}
	for _, t := range DataTables(cfg) {
		add(Requirement{Kind: Schema, Schema: t.Schema, Privilege: "USAGE"})
		add(Requirement{Kind: Schema, Schema: t.Schema, Privilege: "CREATE", IfMissing: t.Name})
		if t.Mirror {
			add(Requirement{Kind: Owner, Schema: t.Schema, Name: t.Name, IfExists: true, Why: "add columns to it and empty it"})
			continue
		}
		for _, p := range []string{"SELECT", "INSERT", "DELETE"} {
			add(Requirement{Kind: Table, Schema: t.Schema, Name: t.Name, Privilege: p, IfExists: true})
		}
	}
	for _, name := range cfg.SourceNames() {
		if s := cfg.Sources[name]; s.Kind() == config.KindTable {
			schema, table := config.SplitTable(s.Table.Name)
			add(Requirement{Kind: Schema, Schema: schema, Privilege: "USAGE"})
			add(Requirement{Kind: Table, Schema: schema, Name: table, Privilege: "SELECT", IfExists: true})
		}
	}
	return dedupe(out)
}

// DataTable is a table that the runtime role creates outside schema raw.
type DataTable struct {
	Schema, Name string
	// Mirror is true for a mirror, false for an aggregate table.
	Mirror bool
	// Key is the configuration key that names it.
	Key string
}

// DataTables lists the mirrors and aggregate tables of cfg.
func DataTables(cfg *config.Config) []DataTable {
	var out []DataTable
	for _, name := range cfg.SourceNames() {
		s := cfg.Sources[name]
		switch {
		case (s.Kind() == config.KindPoll || s.Kind() == config.KindDebezium) && s.Mirror != nil:
			schema, table := config.SplitTable(s.Mirror.Table)
			out = append(out, DataTable{Schema: schema, Name: table, Mirror: true, Key: "sources." + name + ".mirror.table"})
		case s.Kind() == config.KindCDC:
			for _, src := range s.CDC.Tables {
				schema, table := config.SplitTable(s.MirrorTables()[qualified(src)])
				key := "sources." + name + ".mirror.schema"
				if s.Mirror != nil && s.Mirror.Table != "" {
					key = "sources." + name + ".mirror.table"
				}
				out = append(out, DataTable{Schema: schema, Name: table, Mirror: true, Key: key})
			}
		}
	}
	for _, name := range cfg.AggregateNames() {
		schema, table := config.SplitTable(cfg.Aggregates[name].Table)
		out = append(out, DataTable{Schema: schema, Name: table, Key: "aggregates." + name + ".table"})
	}
	return out
}

func qualified(t string) string {
	s, n := config.SplitTable(t)
	return s + "." + n
}

// Source returns what the role of source name needs on its database: a
// poll source's role reads its table; a CDC source's role replicates and
// reads its tables, whose publication must exist unless the role owns the
// tables. database is the source database's name.
func Source(cfg *config.Config, name, database string) []Requirement {
	s := cfg.Sources[name]
	var out []Requirement
	switch {
	case s == nil:
	case s.Kind() == config.KindPoll:
		key, role := "sources."+name+".poll.dsn", "poll source"
		schema, table := config.SplitTable(s.Poll.Table)
		out = append(out,
			Requirement{Key: key, Role: role, Kind: Database, Schema: database, Privilege: "CONNECT"},
			Requirement{Key: key, Role: role, Kind: Schema, Schema: schema, Privilege: "USAGE"},
			Requirement{Key: key, Role: role, Kind: Table, Schema: schema, Name: table, Privilege: "SELECT", IfExists: true})
	case s.Kind() == config.KindCDC:
		key, role := "sources."+name+".cdc.dsn", "CDC source"
		out = append(out,
			Requirement{Key: key, Role: role, Kind: Replication},
			Requirement{Key: key, Role: role, Kind: Database, Schema: database, Privilege: "CONNECT"})
		var tables []string
		for _, t := range s.CDC.Tables {
			schema, table := config.SplitTable(t)
			tables = append(tables, Ident(schema)+"."+Ident(table))
			out = append(out,
				Requirement{Key: key, Role: role, Kind: Schema, Schema: schema, Privilege: "USAGE"},
				Requirement{Key: key, Role: role, Kind: Table, Schema: schema, Name: table, Privilege: "SELECT", IfExists: true})
		}
		out = append(out, Requirement{Key: "sources." + name + ".cdc.publication", Role: role, Kind: Publication,
			Name: s.CDC.Publication, Tables: tables})
	}
	return dedupe(out)
}

func dedupe(rs []Requirement) []Requirement {
	var out []Requirement
	for _, r := range rs {
		if !slices.ContainsFunc(out, func(o Requirement) bool {
			return o.Kind == r.Kind && o.Schema == r.Schema && o.Name == r.Name && o.Privilege == r.Privilege
		}) {
			out = append(out, r)
		}
	}
	return out
}

// SQL of the checks. Each returns NULL when the object does not exist.
const (
	currentRoleSQL = `SELECT current_user, current_database()`
	hasDatabaseSQL = `SELECT has_database_privilege(current_database(), $1)`
	hasSchemaSQL   = `SELECT has_schema_privilege(n.oid, $2) FROM pg_namespace n WHERE n.nspname = $1`
	hasTableSQL    = `SELECT has_table_privilege(c.oid, $3) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`
	tableExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2)`
	ownsTableSQL = `SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`
	replicationSQL = `SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`
	// publicationUsableSQL: the publication exists, or the role could
	// create it (CREATE on the database and ownership of every table).
	publicationUsableSQL = `
SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)
    OR (has_database_privilege(current_database(), 'CREATE')
        AND NOT EXISTS (SELECT 1 FROM unnest($2::text[]) t
                        WHERE to_regclass(t) IS NULL OR NOT pg_has_role((SELECT relowner FROM pg_class WHERE oid = to_regclass(t)), 'USAGE')))`
)

// Querier runs a query: a connection, a pool or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check checks reqs for the role q is connected as and returns a
// *MissingError listing every one it lacks, with the statement that
// grants it. Requirements about objects that do not exist, where their
// absence is someone else's error, are skipped. A superuser passes.
func Check(ctx context.Context, q Querier, reqs []Requirement) error {
	var role, database string
	if err := q.QueryRow(ctx, currentRoleSQL).Scan(&role, &database); err != nil {
		return fmt.Errorf("check privileges: %w", err)
	}
	var problems []string
	for _, r := range reqs {
		ok, err := holds(ctx, q, r)
		if err != nil {
			// The check itself failed: whether the role lacks it is
			// unknown.
			return fmt.Errorf("check privileges: %s of role %s: %w", r.Privilege, role, err)
		}
		if !ok {
			if r.Kind == Database {
				r.Schema = database
			}
			problems = append(problems, fmt.Sprintf("%s: %s: %s (see tidemark grants)", r.Key, r.lacks(role), r.Fix(role)))
		}
	}
	if len(problems) > 0 {
		return &MissingError{Problems: problems}
	}
	return nil
}

// holds reports whether the connected role meets r.
func holds(ctx context.Context, q Querier, r Requirement) (bool, error) {
	var has *bool
	var err error
	switch r.Kind {
	case Database:
		err = q.QueryRow(ctx, hasDatabaseSQL, r.Privilege).Scan(&has)
	case Schema:
		if r.IfMissing != "" {
			var exists bool
			if err := q.QueryRow(ctx, tableExistsSQL, r.Schema, r.IfMissing).Scan(&exists); err != nil || exists {
				return true, err
			}
		}
		err = q.QueryRow(ctx, hasSchemaSQL, r.Schema, r.Privilege).Scan(&has)
		if errors.Is(err, pgx.ErrNoRows) {
			// A missing schema is created by the runtime role
			// itself, which then needs CREATE on the database.
			return r.Privilege != "CREATE" || databaseCreate(ctx, q), nil
		}
	case Table:
		err = q.QueryRow(ctx, hasTableSQL, r.Schema, r.Name, r.Privilege).Scan(&has)
	case Owner:
		err = q.QueryRow(ctx, ownsTableSQL, r.Schema, r.Name).Scan(&has)
	case Replication:
		err = q.QueryRow(ctx, replicationSQL).Scan(&has)
	case Publication:
		err = q.QueryRow(ctx, publicationUsableSQL, r.Name, r.Tables).Scan(&has)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	return has == nil || *has, err
}

func databaseCreate(ctx context.Context, q Querier) bool {
	var has bool
	return q.QueryRow(ctx, hasDatabaseSQL, "CREATE").Scan(&has) == nil && has
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// Ident quotes a name for SQL when it needs quotes: tidemark_run stays as
// it is, "Shop" gets them.
func Ident(name string) string {
	if plainIdent.MatchString(name) && !reserved[name] {
		return name
	}
	return pgquote.Ident(name)
}

// reserved are reserved key words that a plain name must not be.
var reserved = map[string]bool{
	"all": true, "analyse": true, "analyze": true, "and": true, "any": true, "array": true, "as": true, "asc": true,
	"asymmetric": true, "both": true, "case": true, "cast": true, "check": true, "collate": true, "column": true,
	"constraint": true, "create": true, "current_catalog": true, "current_date": true, "current_role": true,
	"current_time": true, "current_timestamp": true, "current_user": true, "default": true, "deferrable": true,
	"desc": true, "distinct": true, "do": true, "else": true, "end": true, "except": true, "false": true, "fetch": true,
	"for": true, "foreign": true, "from": true, "grant": true, "group": true, "having": true, "in": true,
	"initially": true, "intersect": true, "into": true, "lateral": true, "leading": true, "limit": true,
	"localtime": true, "localtimestamp": true, "not": true, "null": true, "offset": true, "on": true, "only": true,
	"or": true, "order": true, "placing": true, "primary": true, "references": true, "returning": true,
	"select": true, "session_user": true, "some": true, "symmetric": true, "table": true, "then": true, "to": true,
	"trailing": true, "true": true, "union": true, "unique": true, "user": true, "using": true, "variadic": true,
	"when": true, "where": true, "window": true, "with": true,
}

// hint is what Explain adds to a refused statement.
const hint = "the role lacks a privilege; `tidemark grants` prints what each role needs"

// Explain adds a pointer to `tidemark grants` to an error that is, or
// wraps, a PostgreSQL "insufficient privilege" error
// (pgerr.InsufficientPrivilege), and returns any other error unchanged.
func Explain(err error) error {
	if !pgerr.InsufficientPrivilege(err) {
		return err
	}
	var done *explained
	if errors.As(err, &done) {
		return err
	}
	return &explained{err: err}
}

type explained struct{ err error }

func (e *explained) Error() string { return e.err.Error() + " (" + hint + ")" }
func (e *explained) Unwrap() error { return e.err }

// LogHandler wraps h so that a log record with an error attribute that
// is a missing privilege (pgerr.InsufficientPrivilege) also carries a
// hint pointing at `tidemark grants`: components that retry their own
// failures log them instead of returning them.
func LogHandler(h slog.Handler) slog.Handler { return hintHandler{h} }

type hintHandler struct{ slog.Handler }

func (h hintHandler) Handle(ctx context.Context, r slog.Record) error {
	refused := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && pgerr.InsufficientPrivilege(err) {
			refused = true
			return false
		}
		return true
	})
	if refused {
		r = r.Clone()
		r.AddAttrs(slog.String("hint", hint))
	}
	return h.Handler.Handle(ctx, r)
}

func (h hintHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return hintHandler{h.Handler.WithAttrs(attrs)}
}

func (h hintHandler) WithGroup(name string) slog.Handler {
	return hintHandler{h.Handler.WithGroup(name)}
}

// sourceCheckTimeout bounds the check of one source, connection included:
// a source that accepts connections but does not answer (a half-open
// network path, a stalled server) must not hold `tidemark run` before it
// starts.
var sourceCheckTimeout = 30 * time.Second

// CheckSources checks the roles of the named poll and CDC sources, each on
// a connection of its own to the source's database, within
// sourceCheckTimeout each. A source that cannot be reached now is left
// out, and reported to log: the component that reads it retries its
// connection and reports the failure itself.
func CheckSources(ctx context.Context, cfg *config.Config, names []string, log *slog.Logger) error {
	var problems []string
	for _, name := range names {
		s := cfg.Sources[name]
		var dsn string
		switch {
		case s == nil:
			continue
		case s.Kind() == config.KindPoll:
			dsn = s.Poll.DSN
		case s.Kind() == config.KindCDC:
			dsn = s.CDC.DSN
		default:
			continue
		}
		err := checkSource(ctx, cfg, name, dsn, log)
		var missing *MissingError
		switch {
		case errors.As(err, &missing):
			problems = append(problems, missing.Problems...)
		case err != nil:
			return fmt.Errorf("sources.%s: %w", name, err)
		}
	}
	if len(problems) > 0 {
		return &MissingError{Problems: problems}
	}
	return nil
}

// checkSource checks the role of one source on a hardened connection (see
// pgconnect.Parse), within sourceCheckTimeout.
func checkSource(ctx context.Context, cfg *config.Config, name, dsn string, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, sourceCheckTimeout)
	defer cancel()
	var conn *pgx.Conn
	cc, err := pgconnect.Parse(dsn, "tidemark-grants")
	if err == nil {
		conn, err = pgx.ConnectConfig(ctx, cc)
	}
	if err != nil {
		if log != nil {
			log.Warn("cannot check the privileges of the source's role now", "source", name, "err", err)
		}
		return nil
	}
	defer pgconnect.Close(ctx, conn)
	return Check(ctx, conn, Source(cfg, name, ""))
}

// Join combines the results of several checks into one error that lists
// every missing privilege; an error other than missing privileges wins.
func Join(errs ...error) error {
	var problems []string
	for _, err := range errs {
		var missing *MissingError
		switch {
		case err == nil:
		case errors.As(err, &missing):
			problems = append(problems, missing.Problems...)
		default:
			return err
		}
	}
	if len(problems) > 0 {
		return &MissingError{Problems: problems}
	}
	return nil
}
