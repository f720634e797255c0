// Package remotedev serves a verbs.Device to another process and proxies it.
//
// Serve runs on the process that owns the device; NewClient (or Dial) runs on
// the other end of a stream and returns a *Client that implements
// verbs.Device, and through it PD, MR, CQ, QP, SRQ and AH, by forwarding
// every call. Its first user is the conformance suite run across two
// processes (one soft RNIC per process, talking the real TCP fabric
// protocol); the same shape is what a daemon/client split needs.
//
// # Protocol
//
// Requests and responses are gob-encoded structs on one bidirectional
// stream, matched by a sequence number, so any number of goroutines may call
// at once: the server runs each request in its own goroutine. Server objects
// are named by uint64 handles. Errors travel as their text plus their
// identity (internal/errid): the names of the sentinel errors they match
// (verbs.ErrQPState, offheap.ErrNotOffHeap, context.DeadlineExceeded ...),
// their verbs.Status and CompletionError, so
// errors.Is and errors.As give on the client what they gave on the server.
// Every call has a deadline (Options.CallTimeout); CQ.Wait is a loop of
// bounded server-side waits, so it honours the caller's context without the
// server holding a request open forever.
//
// # Memory
//
// An RNIC on the server can only reach memory the server has mapped, so
// Client PD.RegMR accepts only buffers inside an offheap.AllocShared block:
// the server maps the same memfd through /proc/PID/fd/N (client and server
// must share a PID namespace and user) and registers the same byte range of
// its own mapping. The proxied MR's Addr, LKey and RKey are the server's, as
// SGEs and remote operations are interpreted by the server's RNIC; Bytes is
// the client's own slice over the same pages.
//
// # Lifetime
//
// Client.Close closes the served device and the stream. If the stream breaks
// instead, Serve closes every object the client made (not the device, which
// it does not own) and every call on the client fails with an error wrapping
// verbs.ErrClosed.
//
// StartChild runs a server in a child process connected by a socketpair;
// ChildConn is the child's end.
package remotedev
