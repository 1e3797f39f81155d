package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// newPositionedStage returns the stage of a relation with a position
// column or JSON rows. Besides kind, time and absent columns it holds each
// change's position and the time of a truncate that came after it, and
// the row: as one jsonb (JSON rows) or in the mirror's types (text rows).
func newPositionedStage(r *Relation) *stageRows {
	h := fnv.New64a()
	var cols string
	var jsonNames map[string]string
	if r.JSON {
		// Each column's name as a JSON object key, with its colon.
		jsonNames = make(map[string]string, len(r.Columns))
		for _, c := range r.Columns {
			k, _ := json.Marshal(c)
			jsonNames[c] = string(k) + ":"
		}
		cols = `"tidemark row" jsonb`
		fmt.Fprintf(h, "json\x00%s", r.Mirror.Target.Sanitize())
	} else {
		cols = strings.Join(typedColumns(r, h), ", ")
	}
	name := pgquote.Ident("pg_temp", fmt.Sprintf("tidemark_pos_%016x", h.Sum64()))
	return &stageRows{r: r, name: name, w: copytext.New(), positioned: true, jsonNames: jsonNames,
		ddl: fmt.Sprintf(createPositionedStageSQL, name, cols)}
}

// positions stages the position of s and the truncate after it.
func (st *stageRows) positions(s *state) {
	if s.at.Position == nil {
		st.w.Null()
	} else {
		st.w.Text(positionText(s.at.Position))
	}
	if s.delete || s.at.Truncated == nil {
		st.w.Null()
	} else {
		st.w.Time(*s.at.Truncated)
	}
}

// row stages the values of r, or with keyOnly those of its key columns.
func (st *stageRows) row(r Row, keyOnly bool) {
	if st.r.JSON {
		var b strings.Builder
		b.WriteByte('{')
		n := 0
		for _, c := range st.r.Columns {
			v, ok := r[c]
			if !ok || keyOnly && !slices.Contains(st.r.Mirror.Key, c) {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			n++
			b.WriteString(st.jsonNames[c])
			if v == nil {
				b.WriteString("null")
			} else {
				b.WriteString(*v)
			}
		}
		b.WriteByte('}')
		st.w.Text(b.String())
		st.w.End()
		return
	}
	for _, c := range st.r.Columns {
		if v, ok := r[c]; ok && (!keyOnly || slices.Contains(st.r.Mirror.Key, c)) {
			st.w.Value(v)
		} else {
			st.w.Null()
		}
	}
	st.w.End()
}

// positionText is a position as a bigint[] literal.
func positionText(pos []int64) string {
	parts := make([]string, len(pos))
	for i, p := range pos {
		parts[i] = strconv.FormatInt(p, 10)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// writePositioned writes a positioned stage to the mirror, in one round
// trip: the upserts' updates and then inserts, the deletes' flags (or
// removals) and then, with a position column, the flagged rows of keys the
// mirror lacked.
func (t *Txn) writePositioned(ctx context.Context, st *stageRows) error {
	r, m := st.r, st.r.Mirror
	target := m.Target.Sanitize()
	if m.Hard && r.Position != "" {
		return fmt.Errorf("mirror %s: a mirror with a position column keeps its deletes soft", target)
	}
	// va holds a staged row's values: the stage itself, or the mirror's
	// row type filled from the JSON row.
	va, from := "s", st.name+" AS s"
	if r.JSON {
		va = "v"
		from += fmt.Sprintf(` CROSS JOIN LATERAL jsonb_populate_record(NULL::%s, s."tidemark row") AS v`, target)
	}
	var sets, match, vals []string
	for _, c := range r.Columns {
		q := pgquote.Ident(c)
		vals = append(vals, va+"."+q)
		if slices.Contains(m.Key, c) {
			// Matched by key, the key columns keep their values; a
			// distributed mirror refuses a SET of its distribution
			// column, even to the same value.
			continue
		}
		if st.absent {
			sets = append(sets, fmt.Sprintf(`%[1]s = CASE WHEN %[2]s = ANY(s."tidemark absent") THEN t.%[1]s ELSE %[3]s.%[1]s END`, q, pgquote.Literal(c), va))
		} else {
			sets = append(sets, fmt.Sprintf(`%[1]s = %[2]s.%[1]s`, q, va))
		}
	}
	for _, k := range m.Key {
		q := pgquote.Ident(k)
		match = append(match, fmt.Sprintf("t.%[1]s = %[2]s.%[1]s", q, va))
	}
	loaded, deleted := pgquote.Ident(m.LoadedColumn), pgquote.Ident(m.DeletedColumn)
	var setPos, newer, posCol, posVal string
	if r.Position != "" {
		pos := pgquote.Ident(r.Position)
		setPos = ", " + pos + ` = s."tidemark pos"`
		newer = fmt.Sprintf(` AND (t.%[1]s IS NULL OR t.%[1]s < s."tidemark pos")`, pos)
		posCol, posVal = ", "+pos, `, s."tidemark pos"`
	}
	setList := ""
	if len(sets) > 0 {
		setList = strings.Join(sets, ", ") + ", "
	}
	keyMatch := strings.Join(match, " AND ")
	qb := &pgx.Batch{}
	if st.upserts > 0 {
		qb.Queue(fmt.Sprintf(updatePositionedSQL, target, from, setList, loaded, deleted, setPos, keyMatch, newer), t.loadedAt)
		qb.Queue(fmt.Sprintf(insertPositionedSQL, target, from, pgquote.Idents(r.Columns), loaded, deleted, posCol,
			strings.Join(vals, ", "), posVal, pgquote.Idents(m.Key)), t.loadedAt)
	}
	if st.deletes > 0 {
		switch {
		case m.Hard:
			qb.Queue(fmt.Sprintf(removePositionedSQL, target, from, keyMatch))
		case r.Position == "":
			qb.Queue(fmt.Sprintf(flagPositionedSQL, target, from, deleted, "", keyMatch, " AND t."+deleted+" IS NULL"))
		default:
			qb.Queue(fmt.Sprintf(flagPositionedSQL, target, from, deleted, setPos, keyMatch, newer))
			qb.Queue(fmt.Sprintf(tombstoneSQL, target, from, pgquote.Idents(r.Columns), loaded, deleted, posCol,
				strings.Join(vals, ", "), posVal, pgquote.Idents(m.Key)), t.loadedAt)
		}
	}
	if err := t.tx.SendBatch(ctx, qb).Close(); err != nil {
		return fmt.Errorf("apply changes to %s: %w", target, err)
	}
	t.written.Merged += int64(st.upserts)
	t.written.Deleted += int64(st.deletes)
	return nil
}
