package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// confirmedWithin returns the stored position when the slot is confirmed
// no further than it, and a setup error when the slot is confirmed beyond
// it: another client consumed the slot, it was recreated, or the
// warehouse lost the transactions that stored what tidemark confirmed (a
// failover to an asynchronous standby that had not received them).
//
// pos was read before the slot's state. A reader of the same slot that
// lost its lock without noticing (its lock session ended under it with a
// warehouse restart or a broken connection, while its other sessions
// carried on) may have applied and confirmed more in between, and the
// slot is then legitimately ahead of pos. tidemark confirms a position
// only once a warehouse transaction has stored it, so the position read
// again, after the slot's state, covers everything tidemark confirmed:
// only a slot beyond that one is refused. The position returned is the
// newer one, which the stream must start from.
func (r *Reader) confirmedWithin(ctx context.Context, pos position, slot string, confirmed pglogrepl.LSN) (position, error) {
	if confirmed <= max(pos.applied, pos.confirmed) {
		return pos, nil
	}
	fresh, err := r.position(ctx)
	if err != nil {
		return pos, err
	}
	if fresh.exists {
		pos = fresh
		if confirmed <= max(pos.applied, pos.confirmed) {
			return pos, nil
		}
	}
	return pos, fmt.Errorf("%w: sources.%s.cdc.slot: slot %s is confirmed up to %s, beyond what tidemark applied (%s): another client consumed it, "+
		"it was recreated, or the warehouse lost tidemark's last transactions (a failover to a standby that had not received them, or a restore "+
		"from a backup); the changes in between are not in the mirrors: run tidemark resync %s --new-slot (a new slot, and every table copied again while "+
		"the stream goes on)",
		ErrSetup, r.conf.Source, slot, confirmed, max(pos.applied, pos.confirmed), r.conf.Source)
}
