package cdc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// stream is one replication session: it decodes pgoutput messages, applies
// committed transactions in groups, and confirms the slot only after the
// warehouse has committed what it confirms.
type stream struct {
	r      *Reader
	repl   *pgconn.PgConn
	src    *pgx.Conn
	byName map[string]*table // tracked tables by schema.table
	rels   map[uint32]*table // by relation id, from relation messages
	a      *applier

	// applied is the end of the last transaction the warehouse holds;
	// confirmed the position last confirmed to the slot; walEnd the
	// server's WAL end from its last keepalive.
	applied, confirmed, walEnd pglogrepl.LSN
	sentAt                     time.Time // last status update
	// noticeAt is when a notice of the walsender was last logged,
	// noticesLeft how many were left out since.
	noticeAt        time.Time
	noticesLeft     int
	metricsAt       time.Time // last read of the slot's metrics
	storedConfirmed pglogrepl.LSN
	idleRecordAt    time.Time // last attempt to record an idle position

	// The source transaction being received (not streamed).
	inTxn      bool
	skip       bool
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	seq        int
	xid        uint32 // its transaction id
	groupStart time.Time
	// deferred are the resync chunks whose high marks came inside a
	// transaction, in their order: they are applied once the
	// transaction is.
	deferred []*resyncChunk

	// current is the commit LSN of the transaction being applied.
	current pglogrepl.LSN
	// stopping is set once the stream stops before a transaction it
	// received: the server's WAL end, past that transaction, may not be
	// confirmed as if nothing were pending.
	stopping bool

	// Streamed in-progress transactions, by top-level xid.
	inStream bool
	streamX  uint32
	buffers  map[uint32]*buffer
}

// pluginArgs selects pgoutput protocol 2 with streaming of large
// in-progress transactions. publication_names is a string literal of the
// replication grammar, which doubles quotes and reads no backslash escape,
// holding a list of identifiers that pgoutput splits on commas and folds
// to lower case unless double-quoted: the name is quoted as the
// identifier CREATE PUBLICATION was given, then as a literal.
func pluginArgs(publication string) []string {
	return []string{"proto_version '2'", "publication_names " + pgquote.CommandLiteral(pgquote.Ident(publication)), "streaming 'on'", "messages 'true'"}
}

// slotBusyWait bounds how long a start waits for the slot to be released
// by a walsender that is still ending: that of a replication connection
// this reader has just closed (reading the slot again before a stop), or
// of a reader that died a moment ago. The advisory lock keeps out other
// tidemark readers; a foreign consumer still fails the start after it.
const slotBusyWait = 10 * time.Second

func (s *stream) run(ctx context.Context) error {
	conf := &s.r.conf
	deadline := time.Now().Add(slotBusyWait)
	for {
		// Bounded like every wait before the stream's bound of silence
		// applies.
		sctx, cancel := context.WithTimeout(ctx, s.r.waitTimeout)
		err := pglogrepl.StartReplication(sctx, s.repl, conf.Slot, s.applied,
			pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: pluginArgs(conf.Publication)})
		cancel()
		if pgerr.ObjectInUse(err) && time.Now().Before(deadline) {
			if err := backoff.Sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("start replication from %s: %w", s.applied, err)
		}
		break
	}
	s.r.log.Info("streaming", "slot", conf.Slot, "from", s.applied)
	s.r.m.streaming.Set(1)
	defer s.r.m.streaming.Set(0)
	defer watchStop(ctx, s.repl)()
	defer func() {
		for _, b := range s.buffers {
			b.close()
		}
	}()
	interval := conf.StatusEvery
	// silent is how long the stream has listened without hearing from the
	// server. The server answers a status update that asks for a reply at
	// once, and ends the session itself after wal_sender_timeout without
	// hearing from us; a connection silent for longer than silence is
	// stalled or half-open, and is given up.
	var silent time.Duration
	silence := s.r.silence(interval)
	for {
		if ctx.Err() != nil {
			return s.finish(ctx)
		}
		if err := s.committed(ctx, false); err != nil {
			s.a.rollback(ctx)
			return err
		}
		started := time.Now()
		wait := interval - started.Sub(s.sentAt)
		if s.a.open() && !s.inTxn {
			// Between transactions, a group waits for more only briefly.
			wait = min(wait, s.r.opts.GroupAge-started.Sub(s.groupStart))
		}
		if len(s.a.committing) > 0 {
			// A group is committing: look again soon, to confirm it.
			wait = min(wait, commitPoll)
		}
		var msg pgproto3.BackendMessage
		if wait <= 0 && s.inTxn {
			// Inside a transaction there is nothing to commit: keep
			// receiving, and send the status update that is due.
			if err := s.status(ctx, false); err != nil {
				return err
			}
			wait = interval
		}
		if wait > 0 {
			var err error
			if msg, err = receive(ctx, s.repl, started.Add(wait)); err != nil {
				if ctx.Err() != nil {
					return s.finish(ctx)
				}
				s.a.rollback(ctx)
				return fmt.Errorf("receive: %w", err)
			}
		}
		if msg != nil {
			silent = 0
		} else if wait > 0 {
			silent += time.Since(started)
			if silent > silence {
				s.a.rollback(ctx)
				return fmt.Errorf("receive: %w: nothing from the source for %s", errSilent, silent.Round(time.Millisecond))
			}
		}
		if msg == nil {
			// Nothing arrived in time: commit a group that is due, and
			// tell the server where we stand.
			if s.groupDue() {
				if err := s.commitGroup(ctx); err != nil {
					return err
				}
			}
			ask := silent >= silence/2
			if err := s.statusAsk(ctx, ask, ask); err != nil {
				return err
			}
			continue
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.copyData(ctx, m.Data); err != nil {
				s.a.rollback(ctx)
				return err
			}
		case *pgproto3.ErrorResponse:
			s.a.rollback(ctx)
			return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse:
			// A warning of the walsender (one waiting for a standby of
			// synchronized_standby_slots sends one): not the stream's
			// end.
			s.notice(m)
		default:
			s.a.rollback(ctx)
			return fmt.Errorf("replication: unexpected message %T", msg)
		}
	}
}

// finish commits a complete group before stopping, and confirms the
// groups that committed.
func (s *stream) finish(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitGrace)
	defer cancel()
	if s.a.open() && !s.inTxn {
		if err := s.commitGroup(wctx); err != nil {
			s.a.rollback(wctx)
			return err
		}
	}
	if err := s.committed(wctx, true); err != nil {
		s.a.rollback(wctx)
		return err
	}
	_ = s.status(wctx, false)
	return nil
}

func (s *stream) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("keepalive: %w", err)
		}
		s.walEnd = max(s.walEnd, ka.ServerWALEnd)
		return s.status(ctx, ka.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("xlog data: %w", err)
		}
		s.walEnd = max(s.walEnd, x.ServerWALEnd)
		if d := x.WALData; len(d) > 0 && (d[0] == 'I' || d[0] == 'U' || d[0] == 'D') {
			m, err := parseChange(d, s.inStream)
			if err != nil {
				return fmt.Errorf("decode pgoutput: %w", err)
			}
			return s.change(ctx, m.op, m.xid, m.rel, m.newT, m.oldT)
		}
		msg, err := parseMessage(x.WALData, s.inStream)
		if err != nil {
			return fmt.Errorf("decode pgoutput: %w", err)
		}
		return s.message(ctx, msg)
	}
	return nil
}

// errMalformed is the error of a pgoutput message that cannot be decoded.
var errMalformed = errors.New("malformed pgoutput message")

// parseMessage decodes a pgoutput message with pglogrepl: the stream
// reads inserts, updates and deletes with parseChange instead, which
// copies nothing. pglogrepl indexes into a message without checking its
// length, so an empty, truncated or malformed message panics there; here
// it is an error, which ends the stream (the slot sends the transaction
// again) instead of the process.
func parseMessage(data []byte, inStream bool) (msg pglogrepl.Message, err error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty", errMalformed)
	}
	if !lengthsFit(data, inStream) {
		return nil, fmt.Errorf("%w: type %q, %d bytes: a count or length runs past the end", errMalformed, data[0], len(data))
	}
	defer func() {
		if p := recover(); p != nil {
			msg, err = nil, fmt.Errorf("%w: type %q, %d bytes: %v", errMalformed, data[0], len(data), p)
		}
	}()
	return pglogrepl.ParseV2(data, inStream)
}

// lengthsFit reports whether the counts and lengths that a truncate,
// insert, update or delete message declares fit in it: pglogrepl
// allocates what they declare (up to 4GiB a value) before reading it. It
// reports true when it cannot tell; pglogrepl then finds the problem.
func lengthsFit(data []byte, inStream bool) bool {
	p := data[1:]
	switch data[0] {
	case 'T', 'I', 'U', 'D':
	default:
		return true
	}
	if inStream {
		if len(p) < 4 {
			return true
		}
		p = p[4:] // xid
	}
	if data[0] == 'T' {
		return len(p) < 5 || uint64(binary.BigEndian.Uint32(p))*4 <= uint64(len(p)-5)
	}
	if len(p) < 4 {
		return true
	}
	p = p[4:] // relation id
	if len(p) == 0 || (p[0] != 'N' && p[0] != 'K' && p[0] != 'O') {
		return true
	}
	// A tuple follows its tag; after an update's old tuple pglogrepl
	// skips one byte unread, whatever it is, and reads the new tuple.
	tuples := 1
	if data[0] == 'U' && p[0] != 'N' {
		tuples = 2
	}
	for ; tuples > 0 && len(p) > 0; tuples-- {
		if len(p) < 3 {
			return true
		}
		n := int(binary.BigEndian.Uint16(p[1:]))
		p = p[3:]
		for range n {
			if len(p) < 1 {
				return true
			}
			kind := p[0]
			p = p[1:]
			if kind != pglogrepl.TupleDataTypeText && kind != pglogrepl.TupleDataTypeBinary {
				continue
			}
			if len(p) < 4 {
				return true
			}
			l := uint64(binary.BigEndian.Uint32(p))
			p = p[4:]
			if l > uint64(len(p)) {
				return false
			}
			p = p[l:]
		}
	}
	return true
}

// idle reports whether no tracked change is pending: nothing received and
// not yet committed to the warehouse, no streamed transaction buffered.
func (s *stream) idle() bool {
	return !s.inTxn && !s.a.busy() && !s.inStream && len(s.buffers) == 0 && !s.stopping
}

// status sends a standby status update with every position set
// explicitly (a zero flush position would become the write position). It
// confirms the end of the last transaction the warehouse committed, or,
// when nothing tracked is pending, the server's WAL end, so that an idle
// slot does not pin WAL.
func (s *stream) status(ctx context.Context, force bool) error {
	return s.statusAsk(ctx, force, false)
}

// statusAsk is status that, with ask, asks the server for a reply.
func (s *stream) statusAsk(ctx context.Context, force, ask bool) error {
	pos := max(s.confirmed, s.applied)
	if s.idle() && s.walEnd > pos {
		// Confirming the WAL end takes a durable warehouse commit first,
		// which writes WAL itself: on a server the source shares with
		// the warehouse, each one moves the WAL end the next keepalive
		// reports. Once per status_every, so that an idle reader does
		// not commit in a loop (nor retry in one while the warehouse
		// fails).
		if s.walEnd <= s.storedConfirmed || time.Since(s.idleRecordAt) >= s.r.conf.StatusEvery {
			pos = s.walEnd
		} else {
			pos = max(pos, s.storedConfirmed)
		}
	}
	if !force && pos == s.confirmed && time.Since(s.sentAt) < s.r.conf.StatusEvery {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.r.waitTimeout)
	defer cancel()
	if durable := max(s.applied, s.storedConfirmed); pos > durable {
		// Beyond what the warehouse has applied: record the position
		// first, so that a restart can tell this reader's own advance
		// from another client's. The slot is never confirmed past what
		// the warehouse records.
		s.idleRecordAt = time.Now()
		if err := execDurable(ctx, s.r.pool, storeConfirmedSQL, s.r.conf.Source, pos.String()); err != nil {
			s.r.log.Debug("could not record the idle position; confirming what is applied", "err", err)
			pos = max(s.confirmed, durable)
		} else {
			s.storedConfirmed = pos
		}
	}
	// The keepalive that answers ask shows that the connection works.
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.repl, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ClientTime: time.Now(), ReplyRequested: ask})
	if err != nil {
		return fmt.Errorf("standby status update: %w", err)
	}
	s.confirmed, s.sentAt = pos, time.Now()
	s.r.m.confirmed.Set(float64(pos))
	if time.Since(s.metricsAt) >= s.r.conf.StatusEvery {
		// A query on the source: once per interval, not per group.
		s.slotMetrics(ctx)
		s.metricsAt = time.Now()
	}
	return nil
}

// slotMetrics reads the slot's lag and WAL status from the source.
func (s *stream) slotMetrics(ctx context.Context) { s.r.slotMetrics(ctx, s.src) }

// slotMetrics reads the slot's lag and WAL status from the source through
// src; a failed read leaves the gauges as they are.
func (r *Reader) slotMetrics(ctx context.Context, src *pgx.Conn) {
	var (
		lag    int64
		status string
	)
	if err := src.QueryRow(ctx, slotMetricsSQL, r.conf.Slot).Scan(&lag, &status); err != nil {
		return
	}
	r.m.slotLag.Set(float64(lag))
	for _, w := range walStatuses {
		v := 0.0
		if w == status {
			v = 1
		}
		r.m.walStatus.WithLabelValues(w).Set(v)
	}
}

func (s *stream) message(ctx context.Context, msg pglogrepl.Message) error {
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		r := newRelationInfo(&m.RelationMessage)
		if s.inStream {
			// It may describe the streamed transaction's own DDL: it
			// takes effect if and when the transaction commits.
			t := s.byName[r.Namespace+"."+r.Name]
			if t == nil {
				return nil
			}
			s.rels[r.ID] = t
			t.relID = r.ID
			return s.buffers[s.streamX].relation(m.Xid, &m.RelationMessage)
		}
		return s.relation(ctx, r, s.seq)
	case *pglogrepl.BeginMessage:
		if at := s.r.stopAt; at != nil && m.FinalLSN >= at.lsn {
			return s.stopHere(ctx)
		}
		s.inTxn, s.seq, s.xid = true, 0, m.Xid
		s.commitLSN, s.commitTime = m.FinalLSN, m.CommitTime
		s.current = m.FinalLSN
		// Transactions the warehouse already holds are skipped: after a
		// restart the slot sends again what was not confirmed.
		s.skip = m.FinalLSN < s.applied
		if !s.skip && !s.a.open() {
			if err := s.a.begin(ctx); err != nil {
				return err
			}
			s.groupStart = time.Now()
		}
	case *pglogrepl.CommitMessage:
		s.inTxn = false
		if s.skip {
			s.skip = false
			return s.applyDeferredChunk(ctx, m.TransactionEndLSN)
		}
		s.a.txnDone(m.TransactionEndLSN, m.CommitTime)
		if s.a.changes() >= int64(s.r.opts.GroupChanges) || time.Since(s.groupStart) >= s.r.opts.GroupAge {
			if err := s.commitGroup(ctx); err != nil {
				return err
			}
		}
		return s.applyDeferredChunk(ctx, m.TransactionEndLSN)
	case *pglogrepl.LogicalDecodingMessageV2:
		return s.logicalMessage(ctx, &m.LogicalDecodingMessage)
	case *pglogrepl.LogicalDecodingMessage:
		return s.logicalMessage(ctx, m)
	case *pglogrepl.TruncateMessageV2:
		for _, id := range m.RelationIDs {
			if err := s.change(ctx, opTruncate, m.Xid, id, nil, nil); err != nil {
				return err
			}
		}
	case *pglogrepl.StreamStartMessageV2:
		s.inStream, s.streamX = true, m.Xid
		if s.buffers[m.Xid] == nil {
			s.buffers[m.Xid] = newBuffer(s.r.conf.MaxBufferBytes)
		}
	case *pglogrepl.StreamStopMessageV2:
		s.inStream = false
	case *pglogrepl.StreamAbortMessageV2:
		if b := s.buffers[m.Xid]; b != nil {
			if m.SubXid == m.Xid {
				b.close()
				delete(s.buffers, m.Xid)
			} else {
				b.abort(m.SubXid)
			}
		}
	case *pglogrepl.StreamCommitMessageV2:
		return s.streamCommit(ctx, m)
	}
	return nil
}

// relation records a relation message. A tracked table that gained
// columns has them added to its mirror, inside the open group when there
// is one, so that the change that first carries them is applied with them.
//
// seq is the number of changes the current source transaction has added to
// the open group. A column whose type changed stops the reader (see
// typesKept) once every transaction before the current one is applied.
func (s *stream) relation(ctx context.Context, r *relationInfo, seq int) error {
	t := s.byName[r.Namespace+"."+r.Name]
	if t == nil {
		return nil
	}
	cols := r.Columns
	var added []column
	for _, c := range cols {
		if _, ok := t.mirror.Column(c.name); !ok {
			added = append(added, c)
		}
	}
	if changed := s.typesKept(ctx, t, cols); changed != nil {
		if seq > 0 {
			// The group holds part of this transaction: read again,
			// and stop before it.
			return &stopBefore{lsn: s.current, err: changed}
		}
		// Nothing of this transaction is in the group: apply what came
		// before it, and stop.
		if err := s.applyComplete(ctx); err != nil {
			return err
		}
		return changed
	}
	s.rels[r.ID] = t
	t.relID = r.ID
	if slices.Equal(cols, t.columns) && len(added) == 0 {
		return nil
	}
	// Rows decoded with the old columns are written with them: chunks
	// and groups in the background finish, and the open group's pending
	// changes of the table are written, before the columns change.
	if err := s.a.writePendingOf(ctx, t); err != nil {
		return err
	}
	t.setColumns(cols)
	if len(added) == 0 {
		return nil
	}
	for _, c := range added {
		typ, err := s.typeName(ctx, t, c)
		if err != nil {
			return err
		}
		ddl := fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s", t.mirror.Target.Sanitize(), pgquote.Ident(c.name), typ)
		if s.a.open() {
			if err := s.a.awaitTurn(ctx); err != nil {
				return err
			}
			_, err = s.a.g.tx.Exec(ctx, ddl)
		} else {
			_, err = s.r.pool.Exec(ctx, ddl)
		}
		if err != nil {
			return fmt.Errorf("add column %s to %s: %w", c.name, t.mirror.Target.Sanitize(), err)
		}
		t.mirror.Columns = append(t.mirror.Columns, mirrorColumn(c.name, typ))
		s.r.log.Info("source table gained a column; added to the mirror", "table", t.name, "column", c.name, "type", typ)
	}
	return nil
}

// typeName is the SQL name of column c's type, asked of the source
// within s.r.waitTimeout: the stream waits meanwhile, and its bound of silence
// does not run.
func (s *stream) typeName(ctx context.Context, t *table, c column) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.r.waitTimeout)
	defer cancel()
	var typ string
	if err := s.src.QueryRow(ctx, formatTypeSQL, c.oid, c.mod).Scan(&typ); err != nil {
		return "", fmt.Errorf("type of %s.%s: %w", t.name, c.name, err)
	}
	return typ, nil
}

// typesKept fails with ErrSetup when a column the stream has seen before
// arrives with another type than the mirror's: its values would go into a
// column of the old type, failing or changing on the way. The operator
// alters the mirror's column and starts the reader again (the start checks
// the mirror against the source's current columns). The first relation
// message after a start is not compared: it may describe older WAL, whose
// values the mirror as checked at start can take.
func (s *stream) typesKept(ctx context.Context, t *table, cols []column) error {
	for _, c := range cols {
		i := slices.IndexFunc(t.columns, func(p column) bool { return p.name == c.name })
		if i < 0 || (t.columns[i].oid == c.oid && t.columns[i].mod == c.mod) {
			continue
		}
		m, ok := t.mirror.Column(c.name)
		if !ok {
			continue
		}
		typ, err := s.typeName(ctx, t, c)
		if err != nil {
			return err
		}
		if typ != m.Type {
			return fmt.Errorf("%w: sources.%s: column %s of %s changed type at the source from %s to %s; "+
				"alter the mirror's column to match (ALTER TABLE %s ALTER COLUMN %s TYPE %s) and start tidemark again",
				ErrSetup, s.r.conf.Source, c.name, t.name, m.Type, typ, t.mirror.Target.Sanitize(), pgquote.Ident(c.name), typ)
		}
	}
	return nil
}

// change decodes one row change and applies it, or buffers it when it
// belongs to a streamed transaction.
func (s *stream) change(ctx context.Context, op string, xid, rel uint32, newT, oldT []byte) error {
	t := s.rels[rel]
	if t == nil {
		// Not a tracked table (a publication may hold more).
		return nil
	}
	c := change{op: op, table: t}
	cols := t.columns
	if s.inStream {
		cols = s.buffers[s.streamX].columns(rel, t)
	}
	var err error
	if c.newRow, err = t.decodeTuple(cols, newT); err != nil {
		return err
	}
	if c.oldRow, err = t.decodeTuple(cols, oldT); err != nil {
		return err
	}
	if s.inStream {
		return s.buffers[s.streamX].add(xid, c)
	}
	if s.skip {
		return nil
	}
	c.seq, c.commitLSN, c.commitTime = s.seq, s.commitLSN, s.commitTime
	s.seq++
	s.resyncRecord(s.xid, &c)
	return s.a.add(ctx, c)
}

// streamCommit applies a streamed transaction that committed, as one
// transaction of a group.
func (s *stream) streamCommit(ctx context.Context, m *pglogrepl.StreamCommitMessageV2) error {
	b := s.buffers[m.Xid]
	delete(s.buffers, m.Xid)
	if b == nil {
		return nil
	}
	defer b.close()
	if m.CommitLSN < s.applied {
		return nil
	}
	if at := s.r.stopAt; at != nil && m.CommitLSN >= at.lsn {
		return s.stopHere(ctx)
	}
	if !s.a.open() {
		if err := s.a.begin(ctx); err != nil {
			return err
		}
		s.groupStart = time.Now()
	}
	s.current = m.CommitLSN
	seq := 0
	err := b.each(func(e entry) error {
		if e.Relation != nil {
			return s.relation(ctx, newRelationInfo(e.Relation), seq)
		}
		t := s.rels[e.Rel]
		if t == nil {
			return nil
		}
		c := change{op: e.Op, table: t, newRow: e.New, oldRow: e.Old, seq: seq, commitLSN: m.CommitLSN, commitTime: m.CommitTime}
		seq++
		s.resyncRecord(m.Xid, &c)
		return s.a.add(ctx, c)
	})
	if err != nil {
		return err
	}
	s.a.txnDone(m.TransactionEndLSN, m.CommitTime)
	return s.commitGroup(ctx)
}

// groupDue reports whether the open group, between transactions, is to
// be committed when nothing arrives: once it is GroupAge old. A wait cut
// short to look for a commit (commitPoll) leaves a younger group open:
// closing it at every pause of the stream would make groups smaller the
// busier the machine, each a commit of its own, and split what a group
// could have folded.
func (s *stream) groupDue() bool {
	return s.a.open() && !s.inTxn && time.Since(s.groupStart) >= s.r.opts.GroupAge
}

// stopBefore asks Run to read the slot again and to stop, with err, before
// the transaction that commits at lsn, once every transaction before it
// is applied: an open group that already holds part of that transaction
// cannot commit without it.
type stopBefore struct {
	lsn pglogrepl.LSN
	err error
}

func (e *stopBefore) Error() string { return e.err.Error() }

// stopHere applies what came before the transaction Run stops before, and
// stops with the reason.
func (s *stream) stopHere(ctx context.Context) error {
	if err := s.applyComplete(ctx); err != nil {
		return err
	}
	return s.r.stopAt.err
}

// applyComplete commits the open group when it holds complete source
// transactions, and nothing of the current one, and waits until every
// group has committed and is confirmed. A group without a complete
// transaction is left to the rollback that ends the stream: it has no
// position or commit time to store.
func (s *stream) applyComplete(ctx context.Context) error {
	s.stopping = true
	if s.a.open() && s.a.g.txns > 0 {
		if err := s.commitGroup(ctx); err != nil {
			return err
		}
	}
	return s.committed(ctx, true)
}

// commitGroup starts committing the open group; committed confirms it
// once it has committed. At most maxCommitting groups commit at once.
func (s *stream) commitGroup(ctx context.Context) error {
	for len(s.a.committing) >= maxCommitting {
		if err := s.keepalive(ctx, s.a.committing[0].done); err != nil {
			return err
		}
		if err := s.committedOne(ctx, true); err != nil {
			return err
		}
	}
	s.a.commit()
	return nil
}

// keepalive waits until done is closed (a group committed, a chunk
// written), sending status updates meanwhile: a warehouse that is slow or
// waits for a lock must not let the source's wal_sender_timeout end the
// session, which would make the source decode the slot's WAL again. It
// also keeps the open group's transaction from idling (see keepOpen),
// which waits too when the stream waits for a commit slot or for the
// groups committing to finish.
//
// A stop (ctx) ends the wait: the open group cannot commit anyway while the
// stream is inside a transaction, and a committing group keeps its commit
// grace without the stream waiting for it.
func (s *stream) keepalive(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	default:
	}
	t := time.NewTicker(s.r.conf.StatusEvery)
	defer t.Stop()
	keep := time.NewTicker(s.a.keep)
	defer keep.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := s.status(ctx, true); err != nil {
				return err
			}
		case <-keep.C:
			if err := s.a.keepOpen(ctx); err != nil {
				return err
			}
		}
	}
}

// maxCommitting bounds the groups committing at once; commitPoll is how
// often the stream looks for a commit that finished while nothing arrives.
const (
	maxCommitting = 2
	commitPoll    = 5 * time.Millisecond
)

// committed confirms the groups that finished committing, oldest first,
// waiting for all of them when block is set. A group that failed fails
// the stream: it is read again from the slot.
func (s *stream) committed(ctx context.Context, block bool) error {
	for len(s.a.committing) > 0 {
		n := len(s.a.committing)
		if err := s.committedOne(ctx, block); err != nil {
			return err
		}
		if len(s.a.committing) == n {
			return nil
		}
	}
	return nil
}

// committedOne confirms the oldest committing group if it has finished.
func (s *stream) committedOne(ctx context.Context, block bool) error {
	g := s.a.takeCommitted(block)
	if g == nil {
		return nil
	}
	if g.err != nil {
		return g.err
	}
	// Counted once committed, so that a group that failed and is read
	// again is not counted twice.
	s.r.m.txns.Add(float64(g.txns))
	for op, n := range g.ops {
		s.r.m.changes.WithLabelValues(op).Add(float64(n))
	}
	written := g.mirrors.Written()
	s.r.m.mirrored.WithLabelValues("copied").Add(float64(written.Copied))
	s.r.m.mirrored.WithLabelValues("merged").Add(float64(written.Merged))
	s.r.m.mirrored.WithLabelValues("deleted").Add(float64(written.Deleted))
	s.applied = max(s.applied, g.end)
	for _, st := range g.resyncs {
		st.c.markApplied()
	}
	s.r.m.applyLag.Observe(g.committedAt.Sub(g.lastCommit).Seconds())
	s.r.m.applied.Set(float64(s.applied))
	return s.status(ctx, true)
}

// noticeLogEvery is how often, at most, the reader logs the walsender's
// notices: one waiting for a standby repeats its warning.
const noticeLogEvery = time.Minute

// notice logs a notice or warning the walsender sent in the stream, at
// most once per noticeLogEvery, counting those left out.
func (s *stream) notice(m *pgproto3.NoticeResponse) {
	now := time.Now()
	if !s.noticeAt.IsZero() && now.Sub(s.noticeAt) < noticeLogEvery {
		s.noticesLeft++
		return
	}
	s.r.log.Warn("the source's walsender sent a notice in the stream", "severity", m.Severity, "message", m.Message,
		"detail", m.Detail, "hint", m.Hint, "suppressed", s.noticesLeft)
	s.noticeAt, s.noticesLeft = now, 0
}
