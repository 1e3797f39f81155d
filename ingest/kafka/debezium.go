package kafka

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// A Debezium source writes, in the batch transaction, one raw change row
// per change (as a CDC source does) and the batch's changes to its mirror,
// folded per key; each mirror row keeps the source position of the change
// that wrote it, and a change at or below that position is not applied,
// so a change the connector sends again never moves a row backwards.

// SQL of Debezium sources.
const (
	// readTruncateSQL reads the position and time of the source's last
	// truncate, locked against a truncate committing meanwhile.
	readTruncateSQL = `SELECT position, truncated_at FROM tidemark.debezium_truncates WHERE source = $1 FOR SHARE`
	// storeTruncateSQL records a truncate's position, unless a later
	// one is recorded.
	storeTruncateSQL = `
INSERT INTO tidemark.debezium_truncates AS d (source, position, truncated_at) VALUES ($1, $2, $3)
ON CONFLICT (source) DO UPDATE SET position = EXCLUDED.position, truncated_at = EXCLUDED.truncated_at
WHERE d.position < EXCLUDED.position`
	// flagTruncatedSQL flags the rows a truncate removed: those written
	// before it. %[1]s mirror, %[2]s deleted column, %[3]s position
	// column.
	flagTruncatedSQL = `UPDATE %[1]s SET %[2]s = $1 WHERE %[2]s IS NULL AND (%[3]s IS NULL OR %[3]s < $2)`
)

// errNoMirror means a Debezium source's mirror does not exist and nothing
// says what its columns are.
var errNoMirror = errors.New("the mirror table does not exist")

// errOwnColumn means a change carries a column with the name of one of
// tidemark's own columns of the mirror.
var errOwnColumn = errors.New("a column of the source table has the name of one of the mirror's own columns")

// ownColumn returns an error naming the setting to change when name is
// one of tidemark's own columns of the mirror.
func (m *changeMirror) ownColumn(name string) error {
	for _, o := range []struct{ col, key string }{{m.loaded, "loaded_column"}, {m.deleted, "deleted_column"}, {m.position, "position_column"}} {
		if name == o.col {
			return &fixError{err: fmt.Errorf("%w: the changes carry a column %q, the name of the mirror's %s", errOwnColumn, name, o.key),
				fix: fmt.Sprintf("set sources.%s.mirror.%s to a name the source table does not use (and rename the column of an existing mirror to match), then restart", m.source, o.key)}
		}
	}
	return nil
}

// changeMirror is the mirror of a Debezium source.
type changeMirror struct {
	source                    string
	target                    pgx.Identifier
	loaded, deleted, position string
	// distribute creates the mirror distributed on a Citus warehouse
	// (config.Config.Distributes).
	distribute bool
	// log logs the columns widened.
	log *slog.Logger
	// table is the source table the mirror follows as configured
	// (mirror.source_table), "" when not; topics are the source's.
	table  string
	topics []string

	mu   sync.Mutex
	cols []string // the mirror's columns, tidemark's own left out; nil until read
	key  []string
	// types are the mirror's columns' types, as format_type prints them.
	types map[string]string
	// accepted is the source table of the changes stored, when table is
	// not configured: the first change's, or the latest stored one's.
	accepted string
	// textual are the mirror's bytea, json and jsonb columns, whose values
	// a change without a schema sends as text (see fromText).
	textual map[string]string

	// writer writes the folded changes to the mirror.
	writer mirror.Writer
}

func newChangeMirror(name string, m *ChangeMirror, topics []string, distribute bool) *changeMirror {
	return &changeMirror{source: name, target: m.Target,
		loaded: m.LoadedColumn, deleted: m.DeletedColumn, position: m.PositionColumn, distribute: distribute,
		table: m.SourceTable, topics: topics, log: slog.New(slog.DiscardHandler)}
}

// latestTableSQL reads the source table of the latest change row stored
// that named its table (its source_table is not one of the topics $1),
// among the latest 1,000; %s is the raw table.
const latestTableSQL = `
SELECT source_table FROM (SELECT source_table FROM %s ORDER BY ingested_at DESC LIMIT 1000) AS latest
WHERE source_table <> ALL($1::text[]) LIMIT 1`

// readTable learns the source table of the changes stored, unless the
// configuration names it.
func (m *changeMirror) readTable(ctx context.Context, conn *pgx.Conn, rawTable string) error {
	if m.table != "" {
		return nil
	}
	var table string
	err := conn.QueryRow(ctx, fmt.Sprintf(latestTableSQL, rawTable), m.topics).Scan(&table)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("the table of the changes stored in %s: %w", rawTable, err)
	}
	m.mu.Lock()
	m.accepted = table
	m.mu.Unlock()
	return nil
}

// check refuses a change of a table other than the one the mirror
// follows: mirror.source_table (schema.table, or table in any schema),
// or else the table of the changes stored, or of the first change. A
// change that does not name its table is taken.
func (m *changeMirror) check(c *decode.Change) *decode.Rejection {
	if c == nil || c.TableUnnamed {
		return nil
	}
	want := m.table
	if want != "" {
		if c.Table == want || !strings.Contains(want, ".") && strings.HasSuffix(c.Table, "."+want) {
			return nil
		}
	} else {
		m.mu.Lock()
		if m.accepted == "" {
			m.accepted = c.Table
		}
		want = m.accepted
		m.mu.Unlock()
		if c.Table == want {
			return nil
		}
	}
	return &decode.Rejection{Reason: decode.ReasonWrongTable, Detail: fmt.Sprintf("a change of %s; the source mirrors %s into %s (sources.%s.mirror.source_table, or the table of its changes stored)",
		c.Table, want, m.target.Sanitize(), m.source)}
}

// own are the mirror's columns of tidemark's own.
func (m *changeMirror) own() []mirror.Column {
	return []mirror.Column{
		{Name: m.loaded, Type: "timestamptz", NotNull: true},
		{Name: m.deleted, Type: "timestamptz"},
		{Name: m.position, Type: "bigint[]"},
	}
}

// known returns the mirror's columns and key, nil until read.
func (m *changeMirror) known() ([]string, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cols, m.key
}

// load reads the mirror from the warehouse catalog, adding tidemark's own
// columns when it lacks them; it reports false when there is no mirror.
func (m *changeMirror) load(ctx context.Context, conn *pgx.Conn) (bool, error) {
	cols, key, exists, err := mirror.ReadTarget(ctx, conn, m.target)
	if err != nil || !exists {
		return exists, err
	}
	missing := slices.ContainsFunc(m.own(), func(o mirror.Column) bool {
		return !slices.ContainsFunc(cols, func(c mirror.Column) bool { return c.Name == o.Name })
	})
	if missing {
		if err := mirror.EnsureTarget(ctx, conn, &mirror.Table{Target: m.target}, m.own()); err != nil {
			return true, err
		}
	}
	var names []string
	textual, types := map[string]string{}, map[string]string{}
	for _, c := range cols {
		if c.Name != m.loaded && c.Name != m.deleted && c.Name != m.position {
			names = append(names, c.Name)
		}
		if c.Type == "bytea" || c.Type == "json" || c.Type == "jsonb" {
			textual[c.Name] = c.Type
		}
		types[c.Name] = c.Type
	}
	m.mu.Lock()
	m.cols, m.key, m.textual, m.types = names, key, textual, types
	m.mu.Unlock()
	return true, nil
}

// mirrorPlan is what the changes of a batch need of an existing mirror.
type mirrorPlan struct {
	// adds is a change that declares a column the mirror lacks, nil when
	// none does.
	adds *decode.Change
	// widen holds the columns tidemark widens to hold the values the
	// changes declare, by name, with their new types; unsafe those the
	// operator must alter.
	widen, unsafe map[string]string
}

func (p mirrorPlan) empty() bool { return p.adds == nil && len(p.widen) == 0 && len(p.unsafe) == 0 }

// plan compares the columns the changes of rows declare with the mirror as
// last read.
func (m *changeMirror) plan(rows []*row) mirrorPlan {
	m.mu.Lock()
	cols, types := m.cols, m.types
	m.mu.Unlock()
	p := mirrorPlan{widen: map[string]string{}, unsafe: map[string]string{}}
	var last []decode.Column // the columns of the change before: a batch's changes mostly share them
	for _, r := range rows {
		c := r.ev.Change
		if c == nil || c.Columns == nil || slices.Equal(c.Columns, last) {
			continue
		}
		last = c.Columns
		for _, col := range c.Columns {
			if !slices.Contains(cols, col.Name) {
				if p.adds == nil {
					p.adds = c
				}
				continue
			}
			have := types[col.Name]
			if w, ok := p.widen[col.Name]; ok {
				have = w
			}
			to, safe := mirror.Widen(have, mirror.Values{Type: col.Type, Precision: col.Precision, Scale: col.Scale, Length: col.Length})
			switch {
			case to == "":
			case safe:
				p.widen[col.Name] = to
			default:
				p.unsafe[col.Name] = to
			}
		}
	}
	return p
}

// ensure makes the mirror ready for the changes of rows before the batch
// transaction: it reads it, or creates it from the first change's Connect
// schema; adds the columns a schema declares that it lacks; and widens a
// column whose declared values it cannot hold (mirror.Widen), or refuses
// the changes, naming the ALTER to run, when that is for the operator.
func (m *changeMirror) ensure(ctx context.Context, conn *pgx.Conn, src *source, rows []*row) error {
	cols, _ := m.known()
	if cols != nil {
		if m.plan(rows).empty() {
			return nil
		}
		// The mirror may have changed since it was read (an operator's
		// ALTER): read it again before acting.
		if _, err := m.load(ctx, conn); err != nil {
			return fmt.Errorf("mirror %s (sources.%s.mirror.table): %w", m.target.Sanitize(), m.source, err)
		}
		return m.change(ctx, conn, src, m.plan(rows))
	}
	exists, err := m.load(ctx, conn)
	if err != nil {
		return fmt.Errorf("mirror %s (sources.%s.mirror.table): %w", m.target.Sanitize(), m.source, err)
	}
	if exists {
		src.dec.SetMirrorKey(m.key)
		return m.ensure(ctx, conn, src, rows)
	}
	var declared *decode.Change
	for _, r := range rows {
		if c := r.ev.Change; c != nil && c.Columns != nil {
			declared = c
			break
		}
	}
	if declared == nil {
		return &fixError{err: fmt.Errorf("%w: %s, and the change events carry no schema (the JSON converter without schemas.enable)", errNoMirror, m.target.Sanitize()),
			fix: fmt.Sprintf("create it with the source table's columns and primary key (sources.%s.mirror.table), or send the events with schemas", m.source)}
	}
	return m.change(ctx, conn, src, mirrorPlan{adds: declared})
}

// change carries out plan: it refuses the changes when a column is for
// the operator to alter, creates the mirror or adds the columns of
// plan.adds, widens the columns of plan.widen, and reads the mirror again.
func (m *changeMirror) change(ctx context.Context, conn *pgx.Conn, src *source, plan mirrorPlan) error {
	if plan.empty() {
		return nil
	}
	if len(plan.unsafe) > 0 {
		m.mu.Lock()
		types := m.types
		m.mu.Unlock()
		var what []string
		for name, to := range plan.unsafe {
			what = append(what, fmt.Sprintf("%s (%s, now %s at the source)", name, types[name], to))
		}
		slices.Sort(what)
		return &fixError{err: fmt.Errorf("the changes carry values the mirror %s cannot hold: columns %s", m.target.Sanitize(), strings.Join(what, ", ")),
			fix: mirror.AlterTypesSQL(m.target, plan.unsafe) + " (or another type that holds them); the source then resumes by itself"}
	}
	if declared := plan.adds; declared != nil {
		want := make([]mirror.Column, len(declared.Columns))
		for i, c := range declared.Columns {
			if err := m.ownColumn(c.Name); err != nil {
				return err
			}
			// Only the key is NOT NULL: a delete may write a row of its key.
			want[i] = mirror.Column{Name: c.Name, Type: c.Type, NotNull: slices.Contains(declared.KeyColumns, c.Name)}
		}
		if err := mirror.EnsureTarget(ctx, conn, &mirror.Table{Target: m.target, Columns: want, Key: declared.KeyColumns, Distribute: m.distribute}, m.own()); err != nil {
			return fmt.Errorf("mirror %s (sources.%s.mirror.table): %w", m.target.Sanitize(), m.source, err)
		}
	}
	if len(plan.widen) > 0 {
		if err := mirror.AlterTypes(ctx, conn, m.target, plan.widen); err != nil {
			return &fixError{err: err, fix: mirror.AlterTypesSQL(m.target, plan.widen) + " by hand (or a type that holds the source's values); the source then resumes by itself"}
		}
		m.log.Info("widened columns of a mirror to hold the values the source's schema now declares",
			"source", m.source, "mirror", m.target.Sanitize(), "statement", mirror.AlterTypesSQL(m.target, plan.widen))
	}
	if _, err := m.load(ctx, conn); err != nil {
		return err
	}
	src.dec.SetMirrorKey(m.key)
	return nil
}

// truncation is the last truncate a mirror applied.
type truncation struct {
	pos []int64
	at  time.Time
}

// applyChanges applies the changes of rows, in order, to the mirror
// through the mirror writer: the changes between truncates folded per key,
// each key's latest by position winning, then each truncate. A change
// older than the last truncate (read after it from another partition) is
// applied as truncated: the row it leaves is flagged deleted at the
// truncate's time.
func (m *changeMirror) applyChanges(ctx context.Context, tx pgx.Tx, rows []*row, ingestedAt time.Time) error {
	cols, key := m.known()
	if cols == nil {
		return fmt.Errorf("mirror %s: %w", m.target.Sanitize(), errNoMirror)
	}
	var last truncation
	if err := tx.QueryRow(ctx, readTruncateSQL, m.source).Scan(&last.pos, &last.at); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read the last truncate of %s: %w", m.source, err)
	}
	// The rows go to the mirror as text in its columns' types when every
	// value converts exactly (see textRows), else as JSON.
	texts, err := m.textRows(rows)
	if err != nil {
		return err
	}
	m.mu.Lock()
	typed := make([]mirror.Column, len(cols))
	for i, c := range cols {
		typed[i] = mirror.Column{Name: c, Type: m.types[c]}
	}
	m.mu.Unlock()
	rel := &mirror.Relation{Name: m.target.Sanitize(), Columns: cols, JSON: texts == nil, Position: m.position,
		Mirror: &mirror.Table{Target: m.target, Key: key, Columns: typed, LoadedColumn: m.loaded, DeletedColumn: m.deleted}}
	txn := m.writer.BeginShared(tx, ingestedAt)
	changes := mirror.NewChanges(len(rows))
	for i, r := range rows {
		c := r.ev.Change
		if c.Op == decode.OpTruncate {
			if slices.Compare(c.Position, last.pos) <= 0 {
				continue // applied before
			}
			if err := txn.Write(ctx, changes); err != nil {
				return err
			}
			if err := m.truncate(ctx, tx, c.Position, r.ev.Time); err != nil {
				return err
			}
			// Not sized for the rows left: a batch of many truncates
			// would allocate for them again at each.
			changes, last = mirror.NewChanges(0), truncation{c.Position, r.ev.Time}
			continue
		}
		row := mirror.Row(nil)
		if texts != nil {
			row = texts[i]
		} else if row, err = m.mirrorRow(r); err != nil {
			return err
		}
		for _, k := range key {
			if row[k] == nil {
				return fmt.Errorf("%w: change %s: no value of the key column %s", errBadRow, r.ev.ID, k)
			}
		}
		at := mirror.At{Time: r.ev.Time, Position: c.Position}
		if slices.Compare(c.Position, last.pos) < 0 {
			truncated := last.at
			at.Truncated = &truncated
		}
		switch {
		case c.Op == decode.OpDelete:
			err = changes.Delete(rel, row, at)
		case c.Op == decode.OpInsert && hasColumns(row, cols):
			// An insert of every column: as an update it would take no
			// value from the run's or the mirror's row, and the mirror
			// writer may COPY it when the mirror lacks its key.
			err = changes.Insert(rel, row, at)
		default:
			// The values a change lacks (values Debezium did not have)
			// keep those the batch or the mirror holds.
			err = changes.Update(rel, nil, row, at)
		}
		if err != nil {
			return fmt.Errorf("%w: change %s: %w", errBadRow, r.ev.ID, err)
		}
	}
	return txn.Write(ctx, changes)
}

// hasColumns reports whether row has a value (or NULL) of each of cols.
func hasColumns(row mirror.Row, cols []string) bool {
	for _, c := range cols {
		if _, ok := row[c]; !ok {
			return false
		}
	}
	return true
}

// textKind is how a mirror column's type takes a change's JSON value
// as text, exactly as the mirror writer fills it from a JSON row.
type textKind int

const (
	// textNone: the column is not filled from text (arrays, json,
	// domains, composites, types not listed): the rows go as JSON.
	textNone textKind = iota
	// textScalar: a type read from the text of a string, or of a number
	// as numeric prints it (no exponent, no negative zero).
	textScalar
	// textNumeric: numeric reads any JSON number itself.
	textNumeric
	// textJSONB: jsonb reads any JSON value itself.
	textJSONB
)

// textKindOf is the textKind of a column of type typ, as format_type
// prints it.
func textKindOf(typ string) textKind {
	switch {
	case strings.HasSuffix(typ, "[]"):
		return textNone
	case typ == "jsonb":
		return textJSONB
	case typ == "numeric" || strings.HasPrefix(typ, "numeric("):
		return textNumeric
	}
	switch typ {
	case "smallint", "integer", "bigint", "real", "double precision", "boolean", "text", "date", "uuid", "bytea":
		return textScalar
	}
	for _, p := range []string{"character varying", "character(", "timestamp", "time", "interval"} {
		if strings.HasPrefix(typ, p) {
			return textScalar
		}
	}
	return textNone
}

// textRows returns the rows of the changes of rows as text in the mirror
// columns' types (mirror.Relation.JSON false), or nil when some change
// has no schema, or a value that only the JSON rows give exactly: a
// value of a column not of a textKind, an object or array outside a
// jsonb column, a number with an exponent or a negative zero outside a
// numeric or jsonb column (numeric would print it otherwise), a string
// with a \u escape (whose text the warehouse's JSON parsing decides).
func (m *changeMirror) textRows(rows []*row) ([]mirror.Row, error) {
	m.mu.Lock()
	types := m.types
	m.mu.Unlock()
	kinds := map[string]textKind{}
	out := make([]mirror.Row, len(rows))
	for i, r := range rows {
		c := r.ev.Change
		if c.Op == decode.OpTruncate {
			continue
		}
		if c.Columns == nil || len(c.Values) == 0 {
			return nil, nil
		}
		text := string(c.Row)
		row := make(mirror.Row, len(c.Values))
		for _, v := range c.Values {
			if err := m.ownColumn(v.Name); err != nil {
				return nil, err
			}
			kind, ok := kinds[v.Name]
			if !ok {
				kind = textKindOf(types[v.Name])
				kinds[v.Name] = kind
			}
			val, ok := textOf(text[v.Start:v.End], kind)
			if !ok {
				return nil, nil
			}
			row[v.Name] = val
		}
		out[i] = row
	}
	return out, nil
}

// textOf is the text a column of kind k takes of the JSON value raw (nil
// for null), and false when the JSON row is needed to fill it exactly.
func textOf(raw string, k textKind) (*string, bool) {
	if k == textNone || raw == "" {
		return nil, false
	}
	if raw == "null" {
		return nil, true
	}
	if k == textJSONB {
		return &raw, true
	}
	switch c := raw[0]; {
	case c == '"':
		return unquote(raw)
	case c == 't' || c == 'f':
		return &raw, true
	case c == '-' || c >= '0' && c <= '9':
		if k == textNumeric {
			return &raw, true
		}
		if strings.ContainsAny(raw, "eE") || raw[0] == '-' && strings.Trim(raw[1:], "0.") == "" {
			return nil, false
		}
		return &raw, true
	}
	return nil, false
}

// unquote is the text of a JSON string without \u escapes, and false for
// one with them.
func unquote(raw string) (*string, bool) {
	body := raw[1 : len(raw)-1]
	if !strings.Contains(body, `\`) {
		return &body, true
	}
	if strings.Contains(body, `\u`) {
		// Rather than deciding what \u0000 or a lone surrogate are, as
		// the warehouse does.
		return nil, false
	}
	var b strings.Builder
	b.Grow(len(body))
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' || i+1 == len(body) {
			b.WriteByte(body[i])
			continue
		}
		i++
		switch body[i] {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		default: // " \\ /
			b.WriteByte(body[i])
		}
	}
	s := b.String()
	return &s, true
}

// mirrorRow is the row of r's change as the mirror writer takes it: each
// column's JSON text, nil for null. A change with a schema has its values
// as the columns take them (see fromText), and where they are in its
// Row: the values are taken from one copy of the Row.
func (m *changeMirror) mirrorRow(r *row) (mirror.Row, error) {
	c := r.ev.Change
	if c.Columns != nil && len(c.Values) > 0 {
		text := string(c.Row)
		texts := make([]string, len(c.Values))
		row := make(mirror.Row, len(c.Values))
		for i, v := range c.Values {
			if err := m.ownColumn(v.Name); err != nil {
				return nil, err
			}
			if texts[i] = text[v.Start:v.End]; texts[i] == "null" {
				row[v.Name] = nil
				continue
			}
			row[v.Name] = &texts[i]
		}
		return row, nil
	}
	vals := map[string]json.RawMessage{}
	if err := json.Unmarshal(c.Row, &vals); err != nil {
		return nil, fmt.Errorf("%w: the row of change %s: %w", errBadRow, r.ev.ID, err)
	}
	for name := range vals {
		if err := m.ownColumn(name); err != nil {
			return nil, err
		}
	}
	if c.Columns == nil {
		if err := m.fromText(vals); err != nil {
			return nil, fmt.Errorf("%w: change %s: %w", errBadRow, r.ev.ID, err)
		}
	}
	row := make(mirror.Row, len(vals))
	for name, v := range vals {
		if string(v) == "null" {
			row[name] = nil
			continue
		}
		text := string(v)
		row[name] = &text
	}
	return row, nil
}

// fromText turns the values a change without a schema sends as text into
// what the mirror's columns read: base64 (binary.handling.mode bytes) into
// PostgreSQL's hex text for a bytea column, and the text of a JSON value
// (io.debezium.data.Json) into that value for a json or jsonb column.
// With a schema the decoder has done so.
func (m *changeMirror) fromText(vals map[string]json.RawMessage) error {
	m.mu.Lock()
	textual := m.textual
	m.mu.Unlock()
	for name, typ := range textual {
		v, ok := vals[name]
		if !ok || len(v) == 0 || v[0] != '"' {
			continue
		}
		var text string
		if err := json.Unmarshal(v, &text); err != nil {
			return fmt.Errorf("column %s: %w", name, err)
		}
		if typ == "bytea" {
			b, err := base64.StdEncoding.DecodeString(text)
			if err != nil {
				return fmt.Errorf("column %s (bytea) is not base64: %w", name, err)
			}
			vals[name], _ = json.Marshal(`\x` + hex.EncodeToString(b))
			continue
		}
		if !json.Valid([]byte(text)) || pgjson.Scan([]byte(text), nil, nil) != nil {
			return fmt.Errorf("column %s (%s) holds text that is not JSON jsonb takes", name, typ)
		}
		vals[name] = json.RawMessage(text)
	}
	return nil
}

// truncate flags the rows written before a truncate at pos and records
// its position.
func (m *changeMirror) truncate(ctx context.Context, tx pgx.Tx, pos []int64, at time.Time) error {
	qb := &pgx.Batch{}
	qb.Queue(storeTruncateSQL, m.source, pos, at)
	qb.Queue(fmt.Sprintf(flagTruncatedSQL, m.target.Sanitize(), pgquote.Ident(m.deleted), pgquote.Ident(m.position)), at, pos)
	if err := tx.SendBatch(ctx, qb).Close(); err != nil {
		return fmt.Errorf("truncate %s: %w", m.target.Sanitize(), err)
	}
	return nil
}

// copyChanges writes the change rows of a Debezium source with COPY.
func (w *writer) copyChanges(ctx context.Context, tx pgx.Tx, src *source, rows []*row, ingestedAt time.Time) error {
	// The rows are encoded as the server reads them, a megabyte at a
	// time: the whole batch's COPY data would be as large as its records
	// again.
	c := copytext.NewReader(len(rows), func(c *copytext.Rows, i int) {
		r := rows[i]
		ch := r.ev.Change
		c.Text(r.ev.ID)
		c.Time(r.ev.Time)
		c.Time(ingestedAt)
		c.Text(ch.Op)
		c.Text(ch.Table)
		c.Bytes(r.ev.Payload)
		if ch.Op == decode.OpTruncate {
			c.Null()
		} else {
			c.Text(ch.RowKey)
		}
		if ch.Old != nil {
			c.Bytes(ch.Old)
		} else {
			c.Null()
		}
		if ch.LSN != "" {
			c.Text(ch.LSN)
		} else {
			c.Null()
		}
		c.End()
	})
	defer c.Release()
	_, err := c.CopyFrom(ctx, tx.Conn().PgConn(), raw.ChangeColumns.CopySQL(src.raw.Ident(), false))
	return err
}

// insertChange stores one change row, for a batch checked row by row.
func insertChange(ctx context.Context, tx pgx.Tx, r *row, ingestedAt time.Time) error {
	ch := r.ev.Change
	var rowKey, old, lsn any
	if ch.Op != decode.OpTruncate {
		rowKey = ch.RowKey
	}
	if ch.Old != nil {
		old = string(ch.Old)
	}
	if ch.LSN != "" {
		lsn = ch.LSN
	}
	_, err := tx.Exec(ctx, raw.ChangeColumns.InsertSQL(r.src.raw.Ident()),
		r.ev.ID, r.ev.Time, ingestedAt, ch.Op, ch.Table, string(r.ev.Payload), rowKey, old, lsn)
	return err
}

// ensureMirrors readies the mirrors of the batch's Debezium sources, on
// the writer's connection before the batch transaction (see
// changeMirror.ensure).
func (w *writer) ensureMirrors(ctx context.Context, b *batch) error {
	for src, rows := range changeRows(b.rows) {
		if err := src.mirror.ensure(ctx, w.conn, src, rows); err != nil {
			return forSource(src, err)
		}
	}
	return nil
}

// applyMirrors applies the changes of the batch's Debezium sources to
// their mirrors, in the batch transaction, but for the sources in checked,
// whose changes insertCheckingChanges applies one at a time.
func (w *writer) applyMirrors(ctx context.Context, tx pgx.Tx, b *batch, ingestedAt time.Time, checked map[*source]bool) error {
	for src, rows := range changeRows(b.rows) {
		if checked[src] {
			continue
		}
		if err := src.mirror.applyChanges(ctx, tx, rows, ingestedAt); err != nil {
			return classifyRowError(err, src)
		}
	}
	return nil
}

// changeRows groups the rows of Debezium sources by source, in batch
// order.
func changeRows(rows []row) map[*source][]*row {
	out := map[*source][]*row{}
	for i := range rows {
		if r := &rows[i]; r.src.mirror != nil {
			out[r.src] = append(out[r.src], r)
		}
	}
	return out
}

// checkChunk is how many changes insertCheckingChanges stores under one
// savepoint; a chunk the warehouse refuses is stored again one change at
// a time. A savepoint per change made a batch of 14,000 changes outlast
// warehouse.write_timeout (each savepoint is a subtransaction, and past
// 64 of them every snapshot of the transaction looks into pg_subtrans),
// so that the batch was tried again and again and never written.
const checkChunk = 64

// insertCheckingChanges stores, for the Debezium sources in checked, whose
// rows are checked, each change: its change row unless inRaw or an earlier
// row stored its event (a change refused leaves the next copy of it to be
// stored), and its mirror change. Changes are stored checkChunk at a time
// under a savepoint, and those of a chunk refused one at a time. It
// returns the change rows stored and, as dead letters, the changes the
// warehouse refused.
func (w *writer) insertCheckingChanges(ctx context.Context, tx pgx.Tx, b *batch, inRaw map[eventKey]bool, ingestedAt time.Time, checked map[*source]bool) ([]*row, []deadLetter, error) {
	stored := map[eventKey]bool{}
	var kept []*row
	var rejected []deadLetter
	for src, rows := range changeRows(b.rows) {
		if !checked[src] {
			continue
		}
		for len(rows) > 0 {
			chunk := rows[:min(checkChunk, len(rows))]
			rows = rows[len(chunk):]
			if len(chunk) > 1 {
				got, refused, err := storeChanges(ctx, tx, src, chunk, inRaw, stored, ingestedAt)
				if err != nil {
					return nil, nil, err
				}
				if refused == nil {
					kept = append(kept, got...)
					continue
				}
			}
			for _, r := range chunk {
				got, refused, err := storeChanges(ctx, tx, src, []*row{r}, inRaw, stored, ingestedAt)
				if err != nil {
					return nil, nil, err
				}
				if refused != nil {
					rejected = append(rejected, deadLetter{src: src, rej: decode.Rejection{Reason: decode.ReasonRejectedByStore, Detail: refused.Error()}, rec: r.rec})
				}
				kept = append(kept, got...)
			}
		}
	}
	return kept, rejected, nil
}

// storeChanges stores rows, changes of src in batch order, under one
// savepoint of tx: the change row of each whose event is not in inRaw or
// stored (nor earlier in rows), then their mirror changes. It returns the
// rows whose change rows it stored, adding their events to stored; or,
// when the warehouse refused a row, nothing but the refusal (the
// savepoint rolled back); err is any other failure.
func storeChanges(ctx context.Context, tx pgx.Tx, src *source, rows []*row, inRaw, stored map[eventKey]bool, ingestedAt time.Time) (kept []*row, refused, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	seen := map[eventKey]bool{}
	var werr error
	for _, r := range rows {
		k := keyOf(r)
		if inRaw[k] || stored[k] || seen[k] {
			continue
		}
		seen[k] = true
		if werr = insertChange(ctx, sp, r, ingestedAt); werr != nil {
			break
		}
		kept = append(kept, r)
	}
	if werr == nil {
		werr = src.mirror.applyChanges(ctx, sp, rows, ingestedAt)
	}
	if werr == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, nil, err
		}
		for _, r := range kept {
			stored[keyOf(r)] = true
		}
		return kept, nil, nil
	}
	if err := sp.Rollback(ctx); err != nil {
		return nil, nil, forSource(src, err)
	}
	if err := classifyRowError(werr, src); !errors.Is(err, errBadRow) {
		return nil, nil, err
	}
	return nil, werr, nil
}
