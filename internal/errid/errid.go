// Package errid is the identity of an error across a process boundary: the
// one table of sentinel errors that keep their identity (errors.Is) by a
// name stable across builds, Capture, which records what errors.Is and
// errors.As can learn about an error (those sentinels, its verbs.Status, its
// *verbs.CompletionError), and Identity.Err, which rebuilds on the other side
// an error that answers them the same.
//
// It holds no transport: daemon/wire serialises an Identity in krcored's
// byte protocol, internal/remotedev carries it in its gob stream.
package errid

import (
	"context"
	"errors"
	"os"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/udrpc"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// sentinels are the errors whose identity survives the trip, each by a name
// stable across builds: names, not indices, so two builds with different
// tables agree on what both know. The root package's ErrInvalid, ErrLimit,
// ErrBusy and ErrUnsupported are verbs' and cross under verbs' names.
var sentinels = []struct {
	name string
	err  error
}{
	{"krcore.ErrClosed", krcore.ErrClosed},
	{"krcore.ErrNotConnected", krcore.ErrNotConnected},
	{"krcore.ErrNoCredit", krcore.ErrNoCredit},
	{"krcore.ErrPortInUse", krcore.ErrPortInUse},
	{"krcore.ErrNoRegion", krcore.ErrNoRegion},
	{"krcore.ErrUnreachable", krcore.ErrUnreachable},
	{"krcore.ErrRefused", krcore.ErrRefused},
	{"krcore.ErrNoQP", krcore.ErrNoQP},
	{"krcore.ErrPeerDead", krcore.ErrPeerDead},
	{"krcore.ErrDaemonGone", krcore.ErrDaemonGone},
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
	{"meta.ErrNotFound", meta.ErrNotFound},
	{"meta.ErrTableFull", meta.ErrTableFull},
	{"meta.ErrBadRecord", meta.ErrBadRecord},
	{"meta.ErrTorn", meta.ErrTorn},
	{"meta.ErrNoReply", meta.ErrNoReply},
	{"meta.ErrBadGeometry", meta.ErrBadGeometry},
	{"meta.ErrClosed", meta.ErrClosed},
	{"meta.ErrNodeInUse", meta.ErrNodeInUse},
	{"udrpc.ErrClosed", udrpc.ErrClosed},
	{"udrpc.ErrNoReply", udrpc.ErrNoReply},
	{"udrpc.ErrTooLong", udrpc.ErrTooLong},
	{"offheap.ErrNotOffHeap", offheap.ErrNotOffHeap},
	{"offheap.ErrClosed", offheap.ErrClosed},
	{"offheap.ErrPinned", offheap.ErrPinned},
	{"offheap.ErrBadSize", offheap.ErrBadSize},
	{"offheap.ErrNotSealed", offheap.ErrNotSealed},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
	{"os.ErrDeadlineExceeded", os.ErrDeadlineExceeded},
	{"os.ErrNotExist", os.ErrNotExist},
	{"os.ErrPermission", os.ErrPermission},
}

// Sentinels lists the errors whose identity crosses, in the table's order;
// verbs.Status and *verbs.CompletionError cross too.
func Sentinels() []error {
	errs := make([]error, len(sentinels))
	for i, s := range sentinels {
		errs[i] = s.err
	}
	return errs
}

// Identity is what errors.Is and errors.As can learn about an error, in a
// form that crosses a process boundary. Its fields are exported for the
// encoders that carry it (gob, JSON, daemon/wire's byte codec).
type Identity struct {
	// Sentinels are the names of the table's sentinels the error matches.
	Sentinels []string
	// HasStatus says the error matches Status (errors.As a verbs.Status).
	HasStatus bool
	Status    verbs.Status
	// Completion is the *verbs.CompletionError the error matches, or nil.
	Completion *verbs.CompletionError
}

// Capture records err's identity (the zero Identity for nil).
func Capture(err error) Identity {
	var id Identity
	if err == nil {
		return id
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			id.Sentinels = append(id.Sentinels, s.name)
		}
	}
	var st verbs.Status
	if errors.As(err, &st) {
		id.HasStatus, id.Status = true, st
	}
	var ce *verbs.CompletionError
	if errors.As(err, &ce) {
		c := *ce
		id.Completion = &c
	}
	return id
}

// Err rebuilds an error whose text is text and that matches wrapped and
// what id records. A sentinel name the table does not hold (a newer build
// on the other side) is dropped: the text still says what happened.
func (id Identity) Err(text string, wrapped ...error) error {
	e := &Error{text: text, wrapped: append([]error(nil), wrapped...)}
	for _, name := range id.Sentinels {
		if s := lookup(name); s != nil {
			e.wrapped = append(e.wrapped, s)
		}
	}
	if id.HasStatus {
		e.wrapped = append(e.wrapped, id.Status)
	}
	if id.Completion != nil {
		c := *id.Completion
		e.wrapped = append(e.wrapped, &c)
	}
	return e
}

// lookup is the sentinel the table holds under name, or nil.
func lookup(name string) error {
	for _, s := range sentinels {
		if s.name == name {
			return s.err
		}
	}
	return nil
}

// Error is an error rebuilt from its text and Identity on the far side of
// a process boundary. It matches (errors.Is, errors.As) what the original
// matched, and what Identity.Err was given besides.
type Error struct {
	text    string
	wrapped []error
}

// Error is the text Identity.Err was given: the original's, as its process
// reported it.
func (e *Error) Error() string { return e.text }

// Unwrap returns what the error matches.
func (e *Error) Unwrap() []error { return e.wrapped }
