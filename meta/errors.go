package meta

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Test them with errors.Is; returned errors wrap them with
// the node, server and operation involved.
var (
	// ErrNotFound: no server holds a record for the node (never
	// registered, deregistered, or its lease lapsed).
	ErrNotFound = errors.New("meta: node not found")
	// ErrTableFull: the node's bucket has no free slot on the server.
	ErrTableFull = errors.New("meta: table bucket full")
	// ErrBadRecord: a record or argument is invalid (node 0, address too
	// long, negative lease).
	ErrBadRecord = errors.New("meta: invalid record")
	// ErrTorn: a bucket read torn on every READ for
	// ClientConfig.TornWait: the server rewrote it all that time, its
	// writer stalled longer mid-write, or the slot is corrupt.
	ErrTorn = errors.New("meta: bucket read torn on every retry")
	// ErrNoReply: a server did not answer a request within its attempts.
	ErrNoReply = errors.New("meta: no reply from server")
	// ErrBadGeometry: a server's table cannot be read by this client.
	ErrBadGeometry = errors.New("meta: unusable table geometry")
	// ErrNodeInUse: a live record (its lease running) holds the node id
	// for a node at another fabric address.
	ErrNodeInUse = errors.New("meta: node id in use at another address")
	// ErrClosed: the client or server is closed.
	ErrClosed = errors.New("meta: closed")
)

// Internal decode errors; clients see ErrTorn once retries run out.
var (
	errTorn    = errors.New("meta: slot CRC mismatch (torn read)")
	errBadSlot = errors.New("meta: malformed slot")
)

// ServerError is one server's failure within a call sent to every server.
type ServerError struct {
	Server Info
	Err    error
}

// Error is the server's error, which names the server.
func (e ServerError) Error() string { return e.Err.Error() }

// Unwrap returns the server's error.
func (e ServerError) Unwrap() error { return e.Err }

// PartialError reports a Register or Deregister that some servers accepted
// and others did not. The call took effect where it succeeded (and a
// registration keeps renewing everywhere, which repairs the failed servers
// once they answer). errors.Is sees every server's error.
type PartialError struct {
	Op        string // "register", "deregister"
	Node      uint64
	Succeeded int
	Failed    []ServerError
}

// Error lists each failed server's error.
func (e *PartialError) Error() string {
	msgs := make([]string, len(e.Failed))
	for i, f := range e.Failed {
		msgs[i] = f.Error()
	}
	return fmt.Sprintf("meta: %s node %d: %d of %d servers failed: %s",
		e.Op, e.Node, len(e.Failed), len(e.Failed)+e.Succeeded, strings.Join(msgs, "; "))
}

// Unwrap returns the servers' errors.
func (e *PartialError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f
	}
	return errs
}
