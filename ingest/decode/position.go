package decode

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// Phases of a position: at the same place in the source's log, a
// snapshot read orders before a streamed change.
const (
	phaseSnapshot = 0
	phaseStream   = 1
)

// position is the source position of a change: a list of integers that
// orders the changes of one source database, compared element by element
// (as PostgreSQL compares bigint[]), with lsnText the PostgreSQL LSN.
//
//   - PostgreSQL: [0, L, 0] for a snapshot read, where L is source.lsn;
//     [1, C, L] for a streamed change, where C is the last committed LSN
//     before the change's transaction (the first of source.sequence;
//     source.lsn when the sequence lacks it). Transactions are streamed in
//     commit order, and each one's changes in LSN order. Every streamed
//     change orders after every snapshot read: a read's LSN cannot be
//     ordered against a transaction that was in progress when the
//     snapshot was taken and committed after it, whose changes are
//     streamed.
//   - MySQL: [F, P, 0, R] for a snapshot read and [F, P, 1, R] for a
//     streamed change, where F is the number of the binlog file (the
//     digits of source.file's extension), P source.pos and R source.row.
func position(src []field, snapshot bool) ([]int64, string, error) {
	connector, _ := textOf(get(src, "connector"))
	switch {
	case connector == "":
		switch {
		case nullable(get(src, "lsn")) != nil:
			connector = "postgresql"
		case nullable(get(src, "file")) != nil:
			connector = "mysql"
		default:
			return nil, "", errors.New("no source position: neither source.lsn (PostgreSQL) nor source.file and source.pos (MySQL)" +
				" (a flattened event needs them in add.fields)")
		}
	}
	phase := int64(phaseStream)
	if snapshot {
		phase = phaseSnapshot
	}
	switch connector {
	case "postgresql":
		lsn, err := number(src, "lsn")
		if err != nil {
			return nil, "", err
		}
		text := lsnText(lsn)
		if snapshot {
			return []int64{phase, lsn, 0}, text, nil
		}
		return []int64{phase, lastCommit(src, lsn), lsn}, text, nil
	case "mysql":
		file, err := stringValue(get(src, "file"))
		if err != nil || file == "" {
			return nil, "", errors.New("source.file is not a binlog file name")
		}
		ext := file[strings.LastIndex(file, ".")+1:]
		n, err := strconv.ParseInt(ext, 10, 64)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("source.file %q does not end in a binlog number", file)
		}
		pos, err := number(src, "pos")
		if err != nil {
			return nil, "", err
		}
		row := int64(0)
		if nullable(get(src, "row")) != nil {
			if row, err = number(src, "row"); err != nil {
				return nil, "", err
			}
		}
		return []int64{n, pos, phase, row}, "", nil
	}
	return nil, "", fmt.Errorf("connector %q: tidemark orders the changes of the postgresql and mysql connectors only", connector)
}

// number reads source.<name> as a non-negative integer (a number, or a
// string of one).
func number(src []field, name string) (int64, error) {
	raw := nullable(get(src, name))
	if raw == nil {
		return 0, fmt.Errorf("no source.%s", name)
	}
	text := string(raw)
	if raw[0] == '"' {
		var err error
		if text, err = stringValue(raw); err != nil {
			return 0, fmt.Errorf("source.%s: %w", name, err)
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("source.%s %s is not a non-negative integer", name, truncate(raw, 40))
	}
	return n, nil
}

// lastCommit is the first LSN of source.sequence, ["<last committed
// LSN>", "<LSN>"], or lsn when there is none.
func lastCommit(src []field, lsn int64) int64 {
	raw := get(src, "sequence")
	if raw == nil {
		return lsn
	}
	text, ok := textOf(raw)
	if !ok || pgjson.Scan([]byte(text), nil, nil) != nil {
		return lsn
	}
	seq, err := arrayItems([]byte(text))
	if err != nil || len(seq) != 2 {
		return lsn
	}
	if _, ok := textOf(seq[1]); !ok {
		return lsn
	}
	first := bytes.TrimSpace(seq[0])
	if string(first) == "null" {
		return lsn
	}
	committed, ok := textOf(first)
	if !ok {
		return lsn
	}
	n, err := strconv.ParseInt(committed, 10, 64)
	if err != nil || n < 0 {
		return lsn
	}
	return n
}

// lsnText is a PostgreSQL LSN as pg_lsn text: two hexadecimal numbers.
func lsnText(lsn int64) string {
	b := make([]byte, 0, 17)
	b = strconv.AppendUint(b, uint64(lsn)>>32, 16)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(uint32(lsn)), 16)
	return strings.ToUpper(string(b))
}
