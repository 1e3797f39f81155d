package cdc

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"
)

// buffer holds the changes of a streamed in-progress transaction until it
// commits or aborts: in memory up to a bound, then in a temporary file.
type buffer struct {
	limit   int
	bytes   int
	mem     []entry
	file    *os.File
	w       *bufio.Writer
	enc     *gob.Encoder
	aborted map[uint32]bool // subtransactions rolled back
}

// entry is one buffered change with the (sub)transaction that made it.
type entry struct {
	Xid uint32
	Op  string
	Rel uint32
	New map[string]*string
	Old map[string]*string
}

func newBuffer(limit int) *buffer { return &buffer{limit: limit, aborted: map[uint32]bool{}} }

func (b *buffer) add(xid uint32, c change) error {
	e := entry{Xid: xid, Op: c.op, Rel: c.table.relID, New: c.newRow, Old: c.oldRow}
	if b.file == nil {
		b.mem = append(b.mem, e)
		b.bytes += c.bytes()
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
		b.mem = nil
		for i := range mem {
			if err := b.enc.Encode(&mem[i]); err != nil {
				return fmt.Errorf("spill a streamed transaction: %w", err)
			}
		}
		return nil
	}
	if err := b.enc.Encode(&e); err != nil {
		return fmt.Errorf("spill a streamed transaction: %w", err)
	}
	return nil
}

// abort drops the changes of a rolled-back subtransaction.
func (b *buffer) abort(subxid uint32) {
	if b.file != nil {
		b.aborted[subxid] = true
		return
	}
	kept := b.mem[:0]
	for _, e := range b.mem {
		if e.Xid != subxid {
			kept = append(kept, e)
		}
	}
	b.mem = kept
}

// each calls fn for every change kept, in order.
func (b *buffer) each(fn func(change) error, rels map[uint32]*table) error {
	emit := func(e entry) error {
		if b.aborted[e.Xid] {
			return nil
		}
		t := rels[e.Rel]
		if t == nil {
			return nil
		}
		return fn(change{op: e.Op, table: t, newRow: e.New, oldRow: e.Old})
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
		var e entry
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read a spilled transaction: %w", err)
		}
		if err := emit(e); err != nil {
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
