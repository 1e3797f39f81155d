package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
)

// askNewSlot asks the readers of a CDC source to replace its slot with a
// new one and resync every table (tidemark resync SOURCE --new-slot).
func askNewSlot(ctx context.Context, db cdc.Querier, source string, stdout, stderr io.Writer) int {
	const app = "tidemark resync"
	ns, err := cdc.RequestNewSlot(ctx, db, source, osUser(), time.Now())
	if err != nil {
		return failed(stderr, app, err)
	}
	switch {
	case ns.Asked:
		fmt.Fprintf(stdout, "%s: %s: a new slot asked for. The changes after %s (the last applied) and before the new slot are missing from "+
			"the raw change table (tidemark.cdc_gaps); the reader replaces the slot as it starts (a reader streaming now starts again within seconds) "+
			"and copies every table again while the stream goes on\n", app, source, ns.Applied)
		return exitOK
	case ns.State == "resync":
		fmt.Fprintf(stdout, "%s: %s: a new slot is asked for already; the reader replaces it as it starts\n", app, source)
		return exitOK
	case ns.State == "":
		fmt.Fprintf(stderr, "%s: %s has no stored position: start tidemark, which creates the slot and copies the tables\n", app, source)
	default:
		fmt.Fprintf(stderr, "%s: %s: its initial snapshot is not done (%s): a snapshot cut short starts again with a new slot by itself\n", app, source, ns.State)
	}
	return exitFailure
}
