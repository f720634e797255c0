package krcore

import (
	"errors"

	"github.com/krcore/krcore/verbs"
)

// The runtime's sentinel errors. Every error an API or a VQ returns wraps
// one of these, or one of the verbs errors below, so that errors.Is
// answers the same whether the runtime is embedded or runs in krcored.
var (
	// ErrClosed: the runtime, the queue or the daemon connection is
	// closed, or the MR was deregistered already.
	ErrClosed = errors.New("krcore: closed")
	// ErrNotConnected: a queue was used before Connect.
	ErrNotConnected = errors.New("krcore: queue not connected")
	// ErrNoCredit: the queue has Credits requests outstanding and the push
	// did not wait.
	ErrNoCredit = errors.New("krcore: no credit: too many requests outstanding")
	// ErrPortInUse: another queue of the runtime is bound to the port.
	ErrPortInUse = errors.New("krcore: port in use")
	// ErrNoRegion: the node exports nothing under the name.
	ErrNoRegion = errors.New("krcore: no such region")
	// ErrUnreachable: the node is unknown to the MetaServer or cannot be
	// reached.
	ErrUnreachable = errors.New("krcore: node unreachable")
	// ErrRefused: the runtime refused a request before it reached a
	// shared QP (bad range, foreign or revoked handle, missing right), or
	// a call naming what is not the caller's (another runtime's MR, a
	// name it did not export).
	ErrRefused = errors.New("krcore: request refused")
	// ErrNoQP: RC-only mode has no RC QP for a new peer: the pool is full
	// and every RC peer is busy.
	ErrNoQP = errors.New("krcore: no RC QP available: the pool is full and every RC peer is busy")
	// ErrPeerDead: the peer stopped answering; calls to it fail at once
	// until a probe finds it alive again.
	ErrPeerDead = errors.New("krcore: peer dead")
	// ErrDaemonGone: krcored closed the connection (shut down, crashed or
	// restarted); only a client of krcored meets it.
	ErrDaemonGone = errors.New("krcore: krcored gone")
)

// Errors of the verbs layer that the runtime passes on, under the names an
// application learns here. They are the verbs values themselves, so either
// name matches.
var (
	// ErrInvalid: a bad argument (size, offset, port, access, handle, a
	// name longer than an export's).
	ErrInvalid = verbs.ErrInvalid
	// ErrLimit: a size or count beyond what the device or runtime allows.
	ErrLimit = verbs.ErrLimit
	// ErrBusy: the object is in use (a queue with requests outstanding
	// reconnected elsewhere; memory still used by requests in flight; an
	// export name taken).
	ErrBusy = verbs.ErrBusy
	// ErrUnsupported: the device or the runtime cannot do it.
	ErrUnsupported = verbs.ErrUnsupported
)
