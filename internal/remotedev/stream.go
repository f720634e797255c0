package remotedev

import (
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/krcore/krcore/verbs"
)

// stream carries gob values both ways over one io.ReadWriteCloser. Writes
// go through one writer goroutine, so a sender waits on channels it can
// give up on (its context) instead of inside a Write that may never return
// on a stream without deadlines (a pipe). Reads are the owner's loop.
type stream struct {
	rwc  io.ReadWriteCloser
	dec  *gob.Decoder
	out  chan frame
	done chan struct{} // closed once the stream has failed or was closed

	once  sync.Once
	cause error // why the stream ended; set before done is closed
	wg    sync.WaitGroup
}

// frame is one value to write and where to report how that went.
type frame struct {
	v    any
	errc chan error // buffered: the writer never blocks on it
}

func newStream(rwc io.ReadWriteCloser) *stream {
	s := &stream{
		rwc:  rwc,
		dec:  gob.NewDecoder(rwc),
		out:  make(chan frame),
		done: make(chan struct{}),
	}
	s.wg.Add(1)
	go s.writeLoop()
	return s
}

// errWriter remembers a write error, telling a broken stream apart from a
// value gob cannot encode (an Endpoint whose address is too long).
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// writeLoop is owned by the stream: it ends when the stream is shut. A
// value that cannot be encoded fails its own send only: gob writes nothing
// for it and stays usable.
func (s *stream) writeLoop() {
	defer s.wg.Done()
	w := &errWriter{w: s.rwc}
	enc := gob.NewEncoder(w)
	for {
		select {
		case f := <-s.out:
			err := enc.Encode(f.v)
			if w.err != nil {
				s.shut(fmt.Errorf("write: %w", w.err))
				return
			}
			if err != nil {
				err = fmt.Errorf("remote: cannot encode %T: %w (%w)", f.v, err, verbs.ErrInvalid)
			}
			f.errc <- err
		case <-s.done:
			return
		}
	}
}

// send writes v, giving up when ctx ends or the stream fails.
func (s *stream) send(ctx context.Context, v any) error {
	f := frame{v: v, errc: make(chan error, 1)}
	select {
	case s.out <- f:
	case <-s.done:
		return s.err()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-f.errc:
		return err
	case <-s.done:
		return s.err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recv decodes the next value into v.
func (s *stream) recv(v any) error {
	if err := s.dec.Decode(v); err != nil {
		s.shut(fmt.Errorf("read: %w", err))
		return s.err()
	}
	return nil
}

// shut ends the stream (first cause wins) and closes the underlying
// connection, which unblocks a pending Read or Write.
func (s *stream) shut(cause error) {
	s.once.Do(func() {
		s.cause = cause
		close(s.done)
		s.rwc.Close()
	})
}

// close shuts the stream and waits for the writer goroutine.
func (s *stream) close() {
	s.shut(errLocalClose)
	s.wg.Wait()
}

var errLocalClose = errors.New("closed locally")

// err is the error calls fail with once the stream has ended: it wraps
// verbs.ErrClosed, as any use of a closed device does.
func (s *stream) err() error {
	<-s.done
	if errors.Is(s.cause, errLocalClose) {
		return fmt.Errorf("remote: connection closed: %w", verbs.ErrClosed)
	}
	return fmt.Errorf("remote: connection lost (%v): %w", s.cause, verbs.ErrClosed)
}
