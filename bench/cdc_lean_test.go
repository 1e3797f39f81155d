package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/raw"
)

// The lean applier is BenchmarkCDC's (a'): the least work a program must
// do to leave in the warehouse what tidemark's reader leaves there, with
// none of tidemark's code on the way but its COPY encoders. It reads a
// slot of its own on the same publication with the options tidemark uses
// (pglogrepl for the protocol; insert, update and delete messages are
// sliced where they lie rather than copied value by value), and per group
// of source transactions, bounded as tidemark's reader bounds its groups
// (10,000 changes or 100 ms, closed at a commit: as many commits, each an
// fsync, as tidemark's), writes in one warehouse transaction:
//
//   - the raw change rows, one COPY in binary into a table of raw.shop's
//     shape, with the values tidemark writes;
//   - the mirror, from the group's changes folded per key in memory (the
//     key's last row and when it was deleted): the rows of keys the group
//     inserted first, which the mirror most likely lacks, one COPY straight
//     into it under a savepoint (a key there after all, inserted again
//     after a delete, fails it, and they are staged with the rest); the
//     rest one COPY into a temporary stage, one INSERT ... ON CONFLICT DO
//     UPDATE of the keys whose row the group holds and one UPDATE flagging
//     the keys deleted whose row it does not (each skipped when empty).
//     The cheapest correct way this workload allows: a COPY of new rows
//     costs the server less than any INSERT of them (and logs less WAL),
//     and a soft delete's row keeps its values, so a key inserted and
//     deleted in one group is COPYed already flagged;
//   - its position, one UPDATE, so that it could resume exactly;
//
// and commits (synchronous_commit on, as the server is set), then
// confirms the slot up to the group's end. As tidemark's reader does, it
// writes a group's raw change rows on a second connection while the group
// before commits, and decodes in a goroutine of its own. It does what this
// workload needs and no more: no streamed transactions, unchanged TOAST
// values, truncates, schema changes or keys of several columns (it fails
// on them); no ledger, metrics or keepalives of a waiting transaction.
type leanApplier struct {
	srcDSN, whDSN string
	slot          string
	publication   string
	end           pglogrepl.LSN // stop after the transaction that holds it
	rawTable      string        // quoted
	mirror        string        // quoted
	position      string        // quoted
}

// leanGroupChanges bounds a group as tidemark's reader's default does
// (cdc.Options.GroupChanges); cdcGroupAge bounds both.
const leanGroupChanges = 10000

// cdcGroupAge is TIDEMARK_BENCH_CDC_GROUP_AGE: the GroupAge of every CDC
// reader the benchmarks start, and the lean applier's; default the
// reader's, 100ms. A long one (2s) makes both group by size alone, at the
// same boundaries, which takes their timing out of BenchmarkCDC's
// comparison (see docs/benchmarks.md).
var cdcGroupAge = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TIDEMARK_BENCH_CDC_GROUP_AGE")); err == nil && d > 0 {
		return d
	}
	return 100 * time.Millisecond
}()

// SQL of the lean applier.
const (
	// leanStageSQL creates the stage: per key its net change, kind 'row'
	// (the key's last row, with when it was deleted, or NULL) or 'delete'
	// (the key alone, and when), with the mirror's columns. %[1]s the
	// mirror.
	leanStageSQL = `CREATE TEMP TABLE lean_stage ON COMMIT DELETE ROWS AS
SELECT ''::text AS kind, t.* FROM %[1]s AS t WITH NO DATA`
	// leanCopyStageSQL fills it; %[1]s the columns.
	leanCopyStageSQL = `COPY lean_stage (kind, deleted_at, %[1]s) FROM STDIN`
	// leanCopyFreshSQL copies the rows of keys the group inserted first
	// straight into the mirror, under leanSavepointSQL; a key the mirror
	// has after all (inserted again after a delete) fails it, and
	// leanRollbackToSQL undoes it. %[1]s mirror, %[2]s columns.
	leanCopyFreshSQL  = `COPY %[1]s (%[2]s, loaded_at, deleted_at) FROM STDIN`
	leanSavepointSQL  = `SAVEPOINT lean_fresh`
	leanRollbackToSQL = `ROLLBACK TO SAVEPOINT lean_fresh`
	// leanUpsertSQL writes the rows staged. %[1]s mirror, %[2]s columns,
	// %[3]s the time loaded, %[4]s the key column, %[5]s the SET list of
	// the others.
	leanUpsertSQL = `INSERT INTO %[1]s AS t (%[2]s, loaded_at, deleted_at)
SELECT %[2]s, %[3]s, deleted_at FROM lean_stage WHERE kind = 'row'
ON CONFLICT (%[4]s) DO UPDATE SET %[5]s, loaded_at = EXCLUDED.loaded_at, deleted_at = EXCLUDED.deleted_at`
	// leanFlagSQL flags the keys deleted whose row the group did not
	// hold. %[1]s mirror, %[2]s key column.
	leanFlagSQL = `UPDATE %[1]s AS t SET deleted_at = s.deleted_at FROM lean_stage AS s
WHERE s.kind = 'delete' AND t.%[2]s = s.%[2]s AND t.deleted_at IS NULL`
	// leanPositionSQL stores the group's end and commits. %[1]s the
	// position's table, %[2]s the end.
	leanPositionSQL = `UPDATE %[1]s SET lsn = %[2]s; COMMIT`
)

// leanRel is a relation of the stream: its name, columns and key column.
type leanRel struct {
	name string
	cols []string
	key  int
}

// leanChange is one row change; its tuples are spans of the group's vals
// (first index, or -1 for none).
type leanChange struct {
	op         string
	rel        *leanRel
	seq        int
	lsn        pglogrepl.LSN
	at         time.Time
	newT, oldT int
}

// leanValue is one column of a tuple: its kind ('n' NULL, 't' text) and
// its text, a substring of the message.
type leanValue struct {
	kind byte
	text string
}

// leanGroup is the changes of a run of source transactions applied in one
// warehouse transaction.
type leanGroup struct {
	changes []leanChange
	vals    []leanValue
	end     pglogrepl.LSN
}

// run applies the slot's changes up to a.end and returns how long that
// took, from the start of replication to the slot confirmed past a.end.
func (a *leanApplier) run(ctx context.Context) (time.Duration, error) {
	cfg, err := pgconn.ParseConfig(a.srcDSN)
	if err != nil {
		return 0, err
	}
	cfg.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer repl.Close(context.WithoutCancel(ctx))

	started := time.Now()
	if err := pglogrepl.StartReplication(ctx, repl, a.slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '2'", "publication_names " + pgquote.CommandLiteral(pgquote.Ident(a.publication)),
			"streaming 'on'", "messages 'true'"},
	}); err != nil {
		return 0, err
	}
	groups := make(chan *leanGroup, 1)
	var committed atomic.Uint64
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	written := make(chan error, 1)
	go func() {
		err := a.write(wctx, groups, &committed)
		if err != nil {
			cancel()
		}
		written <- err
	}()
	rerr := a.receive(wctx, repl, groups, &committed)
	if rerr != nil {
		cancel()
	}
	werr := <-written
	if err := errors.Join(rerr, werr); err != nil {
		return 0, err
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(committed.Load())}); err != nil {
		return 0, err
	}
	return time.Since(started), nil
}

// receive reads the stream and hands the writer a group at a time, up to
// the transaction that holds a.end; it confirms to the source what the
// writer has committed.
func (a *leanApplier) receive(ctx context.Context, repl *pgconn.PgConn, groups chan<- *leanGroup, committed *atomic.Uint64) error {
	defer close(groups)
	rels := map[uint32]*leanRel{}
	var (
		g         *leanGroup
		groupFrom time.Time
		lsn       pglogrepl.LSN
		at        time.Time
		seq       int
		confirmed uint64
	)
	for {
		if c := committed.Load(); c > confirmed {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(c)}); err != nil {
				return err
			}
			confirmed = c
		}
		msg, err := repl.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			return fmt.Errorf("lean applier: unexpected %T", msg)
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			if k.ReplyRequested {
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(confirmed)}); err != nil {
					return err
				}
			}
			continue
		case pglogrepl.XLogDataByteID:
		default:
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return err
		}
		data := xld.WALData
		switch data[0] {
		case 'I', 'U', 'D':
			// The connection reuses its buffer: one copy of the message
			// as a string, of which the values are substrings.
			c, err := leanParse(string(data), rels, g)
			if err != nil {
				return err
			}
			c.seq, c.lsn, c.at = seq, lsn, at
			seq++
			g.changes = append(g.changes, c)
			continue
		case 'B', 'C', 'R':
		case 'M', 'Y', 'O':
			continue
		default:
			return fmt.Errorf("lean applier: pgoutput message %q is not handled", data[0])
		}
		m, err := pglogrepl.ParseV2(data, false)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			lsn, at, seq = m.FinalLSN, m.CommitTime, 0
			if g == nil {
				g, groupFrom = &leanGroup{changes: make([]leanChange, 0, leanGroupChanges)}, time.Now()
			}
		case *pglogrepl.RelationMessageV2:
			r := &leanRel{name: m.Namespace + "." + m.RelationName, key: -1}
			for i, c := range m.Columns {
				r.cols = append(r.cols, c.Name)
				if c.Flags == 1 {
					if r.key >= 0 {
						return errors.New("lean applier: a key of several columns is not handled")
					}
					r.key = i
				}
			}
			rels[m.RelationID] = r
		case *pglogrepl.CommitMessage:
			g.end = m.TransactionEndLSN
			last := g.end >= a.end
			if len(g.changes) >= leanGroupChanges || time.Since(groupFrom) >= cdcGroupAge || last {
				select {
				case groups <- g:
				case <-ctx.Done():
					return ctx.Err()
				}
				g = nil
			}
			if last {
				return nil
			}
		}
	}
}

// leanParse reads an insert, update or delete message, its tuples into
// g.vals.
func leanParse(data string, rels map[uint32]*leanRel, g *leanGroup) (leanChange, error) {
	c := leanChange{newT: -1, oldT: -1}
	switch data[0] {
	case 'I':
		c.op = "insert"
	case 'U':
		c.op = "update"
	default:
		c.op = "delete"
	}
	c.rel = rels[leanUint32(data[1:])]
	if c.rel == nil {
		return c, errors.New("lean applier: a change of an unknown relation")
	}
	p := data[5:]
	for len(p) > 0 {
		tag := p[0]
		at := len(g.vals)
		n := int(p[1])<<8 | int(p[2])
		if n != len(c.rel.cols) {
			return c, fmt.Errorf("lean applier: a tuple of %d columns, the relation has %d", n, len(c.rel.cols))
		}
		p = p[3:]
		for range n {
			v := leanValue{kind: p[0]}
			p = p[1:]
			switch v.kind {
			case 't':
				l := int(leanUint32(p))
				v.text, p = p[4:4+l], p[4+l:]
			case 'n':
			default:
				return c, fmt.Errorf("lean applier: a value of kind %q is not handled", v.kind)
			}
			g.vals = append(g.vals, v)
		}
		if tag == 'N' {
			c.newT = at
		} else {
			c.oldT = at
		}
	}
	return c, nil
}

func leanUint32(s string) uint32 {
	return uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3])
}

// leanState is the net change of one key in a group: its last row (a
// tuple of the group's vals, -1 when the group deleted a row it never
// held), when it was deleted (zero: it was not), and whether the group
// inserted it first (fresh: the mirror most likely lacks it).
type leanState struct {
	rel     *leanRel
	row     int
	key     string
	deleted time.Time
	fresh   bool
}

// write applies the groups in order, each in a transaction of its own on
// one of two connections: a group's raw change rows are written while the
// group before commits; its mirror writes, position and commit wait for
// that commit. It records the end of the last group committed.
func (a *leanApplier) write(ctx context.Context, groups <-chan *leanGroup, committed *atomic.Uint64) error {
	conns := make(chan *pgx.Conn, 2)
	for range 2 {
		conn, err := pgx.Connect(ctx, a.whDSN)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, fmt.Sprintf(leanStageSQL, a.mirror)); err != nil {
			return err
		}
		conns <- conn
	}
	prev := make(chan error, 1)
	prev <- nil
	for g := range groups {
		conn := <-conns
		done := make(chan error, 1)
		go func(prev <-chan error) {
			err := a.writeGroup(ctx, conn.PgConn(), g, prev)
			if err == nil {
				committed.Store(uint64(g.end))
			}
			conns <- conn
			done <- err
		}(prev)
		prev = done
	}
	return <-prev
}

// writeGroup writes group g in a transaction of conn, once prev reports
// the group before committed.
func (a *leanApplier) writeGroup(ctx context.Context, pc *pgconn.PgConn, g *leanGroup, prev <-chan error) error {
	ingestedAt := time.Now().Truncate(time.Microsecond)
	if err := pc.Exec(ctx, "BEGIN").Close(); err != nil {
		return err
	}
	if _, err := pc.CopyFrom(ctx, leanRawRows(g, ingestedAt), raw.ChangeColumns.CopySQL(a.rawTable, true)); err != nil {
		return fmt.Errorf("lean applier: raw rows: %w", err)
	}
	states, byKey := make([]leanState, 0, len(g.changes)), make(map[string]int, len(g.changes))
	for i := range g.changes {
		leanFold(g, &g.changes[i], &states, byKey)
	}
	if err := <-prev; err != nil {
		return err
	}
	if len(states) > 0 {
		if err := a.writeMirror(ctx, pc, g, states, ingestedAt); err != nil {
			return err
		}
	}
	if err := pc.Exec(ctx, fmt.Sprintf(leanPositionSQL, a.position, pgquote.Literal(g.end.String()))).Close(); err != nil {
		return fmt.Errorf("lean applier: commit: %w", err)
	}
	return nil
}

// writeMirror writes the group's net changes to the mirror: the rows of
// fresh keys COPYed straight into it under a savepoint (staged with the
// rest when one is there after all), the rest staged and applied.
func (a *leanApplier) writeMirror(ctx context.Context, pc *pgconn.PgConn, g *leanGroup, states []leanState, loadedAt time.Time) error {
	rel := states[0].rel
	cols := strings.Join(leanIdents(rel.cols), ", ")
	fresh := copytext.New()
	defer fresh.Release()
	var staged []leanState
	for _, s := range states {
		if s.fresh && s.row >= 0 {
			leanRow(fresh, g, s)
			fresh.Time(loadedAt)
			leanDeleted(fresh, s)
			fresh.End()
		} else {
			staged = append(staged, s)
		}
	}
	if fresh.Data().Len() > 0 {
		if err := pc.Exec(ctx, leanSavepointSQL).Close(); err != nil {
			return err
		}
		if _, err := fresh.CopyFrom(ctx, pc, fmt.Sprintf(leanCopyFreshSQL, a.mirror, cols)); err != nil {
			if !pgerr.UniqueViolation(err) {
				return fmt.Errorf("lean applier: fresh rows: %w", err)
			}
			if err := pc.Exec(ctx, leanRollbackToSQL).Close(); err != nil {
				return err
			}
			staged = states
		}
	}
	if len(staged) == 0 {
		return nil
	}
	stage, deletes := copytext.New(), false
	defer stage.Release()
	for _, s := range staged {
		deletes = deletes || s.row < 0
		if s.row >= 0 {
			stage.Text("row")
		} else {
			stage.Text("delete")
		}
		leanDeleted(stage, s)
		leanRow(stage, g, s)
		stage.End()
	}
	if _, err := stage.CopyFrom(ctx, pc, fmt.Sprintf(leanCopyStageSQL, cols)); err != nil {
		return fmt.Errorf("lean applier: stage: %w", err)
	}
	if err := pc.Exec(ctx, a.applySQL(rel, loadedAt, deletes)).Close(); err != nil {
		return fmt.Errorf("lean applier: mirror: %w", err)
	}
	return nil
}

// applySQL is the statements that apply the stage to the mirror.
func (a *leanApplier) applySQL(rel *leanRel, loadedAt time.Time, deletes bool) string {
	cols := leanIdents(rel.cols)
	key := cols[rel.key]
	var set []string
	for _, c := range cols {
		if c != key {
			set = append(set, c+" = EXCLUDED."+c)
		}
	}
	q := fmt.Sprintf(leanUpsertSQL, a.mirror, strings.Join(cols, ", "), pgquote.Literal(loadedAt.Format(time.RFC3339Nano)), key, strings.Join(set, ", "))
	if deletes {
		q += "; " + fmt.Sprintf(leanFlagSQL, a.mirror, key)
	}
	return q
}

func leanIdents(cols []string) []string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pgquote.Ident(c)
	}
	return q
}

// leanFold folds change c into the states of its key: a new row replaces
// the key's, a delete marks it deleted (keeping the row the group holds,
// which a soft-deleting mirror keeps too).
func leanFold(g *leanGroup, c *leanChange, states *[]leanState, byKey map[string]int) {
	state := func(t int) *leanState {
		k := g.vals[t+c.rel.key].text
		i, ok := byKey[k]
		if !ok {
			i = len(*states)
			byKey[k] = i
			*states = append(*states, leanState{rel: c.rel, row: -1, key: k, fresh: c.op == "insert" && t == c.newT})
		}
		return &(*states)[i]
	}
	if c.oldT >= 0 && (c.newT < 0 || g.vals[c.oldT+c.rel.key].text != g.vals[c.newT+c.rel.key].text) {
		s := state(c.oldT)
		if s.deleted.IsZero() {
			s.deleted = c.at
		}
	}
	if c.newT >= 0 {
		s := state(c.newT)
		s.row, s.deleted = c.newT, time.Time{}
	}
}

// leanRow writes a key's columns: its row, or its key alone.
func leanRow(w *copytext.Rows, g *leanGroup, s leanState) {
	for i := range s.rel.cols {
		switch {
		case s.row >= 0 && g.vals[s.row+i].kind == 't':
			w.Text(g.vals[s.row+i].text)
		case s.row < 0 && i == s.rel.key:
			w.Text(s.key)
		default:
			w.Null()
		}
	}
}

// leanDeleted writes when a key was deleted, NULL when it was not.
func leanDeleted(w *copytext.Rows, s leanState) {
	if s.deleted.IsZero() {
		w.Null()
	} else {
		w.Time(s.deleted)
	}
}

// leanRawRows encodes the group's raw change rows in binary, with the
// values tidemark's reader writes.
func leanRawRows(g *leanGroup, ingestedAt time.Time) *copybinary.Reader {
	at := copybinary.Micros(ingestedAt)
	var (
		lsn     pglogrepl.LSN
		lsnText string
	)
	jsonb := func(b []byte, c *leanChange, t int) []byte {
		if t < 0 {
			return copybinary.Null(b)
		}
		b, f := copybinary.OpenJSONB(b)
		b = append(b, '{')
		for i, name := range c.rel.cols {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(pgjson.AppendString(b, name), ':')
			if v := g.vals[t+i]; v.kind == 't' {
				b = pgjson.AppendString(b, v.text)
			} else {
				b = append(b, "null"...)
			}
		}
		return copybinary.Close(append(b, '}'), f)
	}
	return copybinary.NewReader(len(g.changes), func(b []byte, i int) []byte {
		c := &g.changes[i]
		if lsnText == "" || c.lsn != lsn {
			lsn, lsnText = c.lsn, c.lsn.String()
		}
		b = copybinary.Fields(b, len(raw.ChangeColumns))
		b, f := copybinary.Open(b)
		b = append(append(b, lsnText...), '/')
		b = copybinary.Close(strconv.AppendInt(b, int64(c.seq), 10), f)
		b = copybinary.Time(b, c.at)
		b = copybinary.Int64(b, at)
		b = copybinary.Text(b, c.op)
		b = copybinary.Text(b, c.rel.name)
		t := c.newT
		if t < 0 {
			t = c.oldT
		}
		b = jsonb(b, c, t)
		if v := g.vals[t+c.rel.key]; v.kind == 't' {
			b = copybinary.Text(b, v.text)
		} else {
			b = copybinary.Null(b)
		}
		b = jsonb(b, c, c.oldT)
		return copybinary.LSN(b, uint64(c.lsn))
	})
}

// leanTargets creates the lean applier's tables on the warehouse: a raw
// change table raw.shop_<suffix> with the partitions of this month and the
// next, a mirror of dw_orders' shape and a position.
func leanTargets(b *testing.B, whDSN, srcDSN, slot, suffix string, end pglogrepl.LSN) *leanApplier {
	b.Helper()
	ctx := context.Background()
	conn := connect(b, whDSN)
	rt := raw.NewChangeTable("shop_"+suffix, config.PartitionMonth)
	if err := rt.Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	if err := rt.EnsurePartitions(ctx, conn, rt.Missing([]time.Time{now, now.AddDate(0, 1, 0)})); err != nil {
		b.Fatal(err)
	}
	a := &leanApplier{srcDSN: srcDSN, whDSN: whDSN, slot: slot, publication: "tidemark_shop", end: end, rawTable: rt.Ident(),
		mirror: pgquote.Ident("dw_orders_" + suffix), position: pgquote.Ident("lean_position_" + suffix)}
	for _, q := range []string{
		fmt.Sprintf(`CREATE TABLE %s (LIKE dw_orders INCLUDING ALL)`, a.mirror),
		fmt.Sprintf(`CREATE TABLE %s (lsn pg_lsn)`, a.position),
		fmt.Sprintf(`INSERT INTO %s VALUES ('0/0')`, a.position),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	return a
}

// leanMirrorColumns are the columns of dw_orders that the lean applier's
// mirror must equal tidemark's in (loaded_at is the time of each load).
const leanMirrorColumns = "id, customer_id, amount, status, note, placed_at, deleted_at"

// checkLean fails the benchmark unless the lean applier's mirror and raw
// change rows are tidemark's: the same rows, the same values (loaded_at,
// ingested_at and load_xid aside).
func checkLean(b *testing.B, whDSN string, a *leanApplier) {
	b.Helper()
	conn := connect(b, whDSN)
	const rawCols = "event_id, event_time, op, source_table, payload, row_key, old_row, commit_lsn"
	for _, c := range []struct{ what, mine, theirs, cols string }{
		{"mirror", a.mirror, "dw_orders", leanMirrorColumns},
		{"raw change rows", a.rawTable, "raw.shop", rawCols},
	} {
		var differ int64
		q := fmt.Sprintf(`SELECT count(*) FROM ((SELECT %[1]s FROM %[2]s EXCEPT ALL SELECT %[1]s FROM %[3]s)
UNION ALL (SELECT %[1]s FROM %[3]s EXCEPT ALL SELECT %[1]s FROM %[2]s)) AS d`, c.cols, c.mine, c.theirs)
		if err := conn.QueryRow(context.Background(), q).Scan(&differ); err != nil {
			b.Fatal(err)
		}
		if differ != 0 {
			b.Fatalf("the lean applier's %s (%s) differ from tidemark's (%s) in %d rows", c.what, c.mine, c.theirs, differ)
		}
	}
}
