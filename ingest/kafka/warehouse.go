package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
)

func (in *Ingester) writerLocked(ctx context.Context) (*writer, error) {
	if in.w != nil && !in.w.conn.IsClosed() {
		return in.w, nil
	}
	conn, err := in.connect(ctx)
	if err != nil {
		return nil, err
	}
	in.w = &writer{group: in.conf.Group, conn: conn}
	return in.w, nil
}

// connect opens a warehouse connection with the ingester's session
// settings (UTC, so that timestamps read back compare as stored).
func (in *Ingester) connect(ctx context.Context) (*pgx.Conn, error) {
	// The server ends a statement of these sessions that outlives the
	// client's deadline, so that a session the client gave up on does
	// not hold its row locks.
	return pgconnect.Warehouse(ctx, in.conf.Warehouse, "tidemark-ingest",
		map[string]string{"statement_timeout": fmt.Sprintf("%dms", in.conf.WriteTimeout.Milliseconds())})
}

// precreateEvery is how often the ingester creates the raw partitions
// around the service clock's present.
const precreateEvery = 30 * time.Minute

// precreate creates raw partitions around the service clock's present
// every precreateEvery, off the write path, until ctx is done. A failure
// waits for the next time: writes create the partitions they need.
func (in *Ingester) precreate(ctx context.Context) {
	job := periodic.Job{
		Name:    "creating upcoming raw partitions",
		Every:   precreateEvery,
		Timeout: in.conf.WriteTimeout,
		Run:     in.precreateOnce,
		Log:     in.log,
	}
	_ = job.Loop(ctx) // no run's error is final
}

// precreateOnce creates the partitions around the present of every
// source's raw table, on a connection of its own.
func (in *Ingester) precreateOnce(ctx context.Context) error {
	conn, err := in.connect(ctx)
	if err != nil {
		return err
	}
	defer pgconnect.Close(ctx, conn)
	var errs []error
	for _, s := range in.sources {
		if err := s.raw.Precreate(ctx, conn, in.now()); err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

func (in *Ingester) dropConnLocked() {
	if in.w != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = in.w.conn.Close(ctx)
		cancel()
		in.w = nil
	}
}
