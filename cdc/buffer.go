package cdc

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pglogrepl"
)

// buffer holds what a streamed in-progress transaction sent until it
// commits or aborts: its row changes and its relation messages, in order,
// in memory up to a bound, then in a temporary file.
//
// A relation message inside a stream may describe DDL of the streamed
// transaction itself, which is not committed: its columns decode the
// transaction's later tuples (cols), but reach the stream's tables only
// when the transaction commits and its items are applied in order.
type buffer struct {
	limit   int
	bytes   int
	mem     []entry
	file    *os.File
	w       *bufio.Writer
	enc     *gob.Encoder
	aborted map[uint32]bool     // subtransactions rolled back
	cols    map[uint32][]column // relation id: columns as this transaction sees them
}

// entry is one buffered item with the (sub)transaction that sent it: a row
// change, or, when Relation is set, a relation message.
type entry struct {
	Xid      uint32
	Op       string
	Rel      uint32
	New, Old row
	Relation *pglogrepl.RelationMessage
}

// relationInfo is what the stream keeps of a relation message.
type relationInfo struct {
	ID              uint32
	Namespace, Name string
	Columns         []column
}

func newRelationInfo(m *pglogrepl.RelationMessage) *relationInfo {
	r := &relationInfo{ID: m.RelationID, Namespace: m.Namespace, Name: m.RelationName, Columns: make([]column, len(m.Columns))}
	for i, c := range m.Columns {
		r.Columns[i] = column{name: c.Name, oid: c.DataType, mod: c.TypeModifier}
	}
	return r
}

// spilled is an entry as written to the file. gob does not encode nil
// pointers in maps, so values take a form of their own; a column absent
// from a row (an unchanged TOASTed value) stays absent.
type spilled struct {
	Xid      uint32
	Op       string
	Rel      uint32
	New, Old map[string]spilledValue
	Relation *pglogrepl.RelationMessage
}

type spilledValue struct {
	S    string
	Null bool
}

func spillRow(r row) map[string]spilledValue {
	if r == nil {
		return nil
	}
	out := make(map[string]spilledValue, len(r))
	for k, v := range r {
		if v == nil {
			out[k] = spilledValue{Null: true}
		} else {
			out[k] = spilledValue{S: *v}
		}
	}
	return out
}

func unspillRow(r map[string]spilledValue) row {
	if r == nil {
		return nil
	}
	out := make(row, len(r))
	for k, v := range r {
		if v.Null {
			out[k] = nil
		} else {
			s := v.S
			out[k] = &s
		}
	}
	return out
}

func (e *entry) spill() spilled {
	return spilled{Xid: e.Xid, Op: e.Op, Rel: e.Rel, New: spillRow(e.New), Old: spillRow(e.Old), Relation: e.Relation}
}

func (s *spilled) entry() entry {
	return entry{Xid: s.Xid, Op: s.Op, Rel: s.Rel, New: unspillRow(s.New), Old: unspillRow(s.Old), Relation: s.Relation}
}

func newBuffer(limit int) *buffer {
	return &buffer{limit: limit, aborted: map[uint32]bool{}, cols: map[uint32][]column{}}
}

// columns returns the columns that decode a tuple of relation rel inside
// this transaction: those of its own relation messages, else the table's.
func (b *buffer) columns(rel uint32, t *table) []column {
	if c, ok := b.cols[rel]; ok {
		return c
	}
	return t.columns
}

// relation keeps a relation message of the transaction.
func (b *buffer) relation(xid uint32, m *pglogrepl.RelationMessage) error {
	b.cols[m.RelationID] = newRelationInfo(m).Columns
	return b.put(entry{Xid: xid, Rel: m.RelationID, Relation: m}, 64+32*len(m.Columns))
}

// add keeps a row change of the transaction.
func (b *buffer) add(xid uint32, c change) error {
	return b.put(entry{Xid: xid, Op: c.op, Rel: c.table.relID, New: c.newRow, Old: c.oldRow}, c.bytes())
}

func (b *buffer) put(e entry, size int) error {
	if b.file == nil {
		b.mem = append(b.mem, e)
		b.bytes += size
		if b.bytes <= b.limit {
			return nil
		}
		// Over the bound: move everything to disk.
		f, err := os.CreateTemp("", "tidemark-cdc-*.spill")
		if err != nil {
			return fmt.Errorf("spill a streamed transaction: %w", err)
		}
		_ = os.Remove(f.Name()) // the open file stays usable
		b.file, b.w = f, bufio.NewWriterSize(f, 1<<20)
		b.enc = gob.NewEncoder(b.w)
		mem := b.mem
		b.mem, b.bytes = nil, 0
		for i := range mem {
			if err := b.enc.Encode(mem[i].spill()); err != nil {
				return fmt.Errorf("spill a streamed transaction: %w", err)
			}
		}
		return nil
	}
	if err := b.enc.Encode(e.spill()); err != nil {
		return fmt.Errorf("spill a streamed transaction: %w", err)
	}
	return nil
}

// abort drops what a rolled-back subtransaction sent.
func (b *buffer) abort(subxid uint32) {
	if b.file != nil {
		b.aborted[subxid] = true
		return
	}
	kept := b.mem[:0]
	b.bytes = 0
	for _, e := range b.mem {
		if e.Xid != subxid {
			kept = append(kept, e)
			c := change{newRow: e.New, oldRow: e.Old}
			b.bytes += c.bytes()
		}
	}
	clear(b.mem[len(kept):])
	b.mem = kept
}

// each calls fn for every item kept, in order.
func (b *buffer) each(fn func(entry) error) error {
	emit := func(e entry) error {
		if b.aborted[e.Xid] {
			return nil
		}
		return fn(e)
	}
	if b.file == nil {
		for _, e := range b.mem {
			if err := emit(e); err != nil {
				return err
			}
		}
		return nil
	}
	if err := b.w.Flush(); err != nil {
		return err
	}
	if _, err := b.file.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dec := gob.NewDecoder(bufio.NewReaderSize(b.file, 1<<20))
	for {
		var s spilled
		if err := dec.Decode(&s); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read a spilled transaction: %w", err)
		}
		if err := emit(s.entry()); err != nil {
			return err
		}
	}
}

func (b *buffer) close() {
	if b.file != nil {
		_ = b.file.Close()
		b.file = nil
	}
	b.mem = nil
}
