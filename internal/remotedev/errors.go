package remotedev

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// sentinels are the errors whose identity survives the trip, by a name that
// is stable across binaries (not an index, so two builds with different
// tables still agree on what they both know).
var sentinels = []struct {
	name string
	err  error
}{
	{"verbs.ErrClosed", verbs.ErrClosed},
	{"verbs.ErrInvalid", verbs.ErrInvalid},
	{"verbs.ErrLimit", verbs.ErrLimit},
	{"verbs.ErrQPState", verbs.ErrQPState},
	{"verbs.ErrQueueFull", verbs.ErrQueueFull},
	{"verbs.ErrCQOverrun", verbs.ErrCQOverrun},
	{"verbs.ErrBusy", verbs.ErrBusy},
	{"verbs.ErrUnsupported", verbs.ErrUnsupported},
	{"verbs.ErrNoDevice", verbs.ErrNoDevice},
	{"verbs.ErrUnreachable", verbs.ErrUnreachable},
	{"verbs.ErrBadEndpoint", verbs.ErrBadEndpoint},
	{"offheap.ErrNotOffHeap", offheap.ErrNotOffHeap},
	{"offheap.ErrClosed", offheap.ErrClosed},
	{"offheap.ErrPinned", offheap.ErrPinned},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
	{"os.ErrDeadlineExceeded", os.ErrDeadlineExceeded},
	{"os.ErrNotExist", os.ErrNotExist},
	{"os.ErrPermission", os.ErrPermission},
}

// wireError is an error in transit.
type wireError struct {
	Msg        string
	Sentinels  []string
	HasStatus  bool
	Status     verbs.Status
	Completion *verbs.CompletionError
}

// encodeError captures what errors.Is and errors.As can learn about err.
func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			w.Sentinels = append(w.Sentinels, s.name)
		}
	}
	var st verbs.Status
	if errors.As(err, &st) {
		w.HasStatus, w.Status = true, st
	}
	var ce *verbs.CompletionError
	if errors.As(err, &ce) {
		c := *ce
		w.Completion = &c
	}
	return w
}

// decode rebuilds an error that matches the same sentinels, Status and
// CompletionError as the original. Unknown sentinel names (a newer server)
// are dropped: the text still says what happened.
func (w *wireError) decode() error {
	if w == nil {
		return nil
	}
	e := &Error{msg: w.Msg}
	for _, name := range w.Sentinels {
		for _, s := range sentinels {
			if s.name == name {
				e.wrapped = append(e.wrapped, s.err)
			}
		}
	}
	if w.HasStatus {
		e.wrapped = append(e.wrapped, w.Status)
	}
	if w.Completion != nil {
		c := *w.Completion
		e.wrapped = append(e.wrapped, &c)
	}
	return e
}

// Error is an error returned by the server. Its text is the server's; it
// matches (errors.Is, errors.As) the sentinel errors, verbs.Status and
// *verbs.CompletionError the server's error matched.
type Error struct {
	msg     string
	wrapped []error
}

// Error returns the server's error text.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the sentinels, Status and CompletionError the server's
// error matched.
func (e *Error) Unwrap() []error { return e.wrapped }

// callError adds which call failed, for logs that mix two processes.
func callError(o op, err error) error {
	return fmt.Errorf("remote %s: %w", o, err)
}
