// Package krcore is the vocabulary every krcore layer and application
// programs against: the runtime (API), its virtual queues (VQ), the
// requests pushed on them and the completions and messages that come back,
// local and remote ranges, opaque handles for registered memory (MR) and
// remote regions (Region), and every sentinel error.
//
// Two implementations exist, and code written against this package runs
// unchanged on both:
//
//   - core.New plus core.Embed: a runtime inside the process.
//   - client.Attach: the node's shared runtime in krcored, reached over a
//     Unix socket and shared-memory rings.
//
// Nothing above those two packages imports either, except to construct
// one. Errors match the same sentinels (errors.Is) on both.
//
// # Virtual queues
//
// A VQ behaves like one private RC queue pair to the node it is connected
// to: its requests complete in order and it sees only its own completions,
// with verbs' status names (verbs.Status), while the runtime multiplexes
// every VQ of the node onto a few shared QPs. Connect costs a cached
// lookup or one RDMA READ of the MetaServer, never a handshake with the
// peer in the common case.
//
// # Protection
//
// Requests name memory by handle and offset, never by key. An MR is
// memory registered with the runtime that handed it out; a Region is a
// grant a node made under a name (Export), learned by Region. Neither
// reveals an rkey, and a handle another runtime made, or a value built by
// the caller, is refused before it reaches a shared QP. The bounds and
// rights of a Region are enforced where the memory lives: its exporter
// registered exactly those bytes with exactly those rights. Who may learn
// it is decided there too: an export to an audience (Principal: a node and
// a port) answers only a lookup from a queue of that node bound to that
// port (VQ.Region), which its runtime, or krcored for a client, vouches
// the asker holds.
//
// # Messages and notifications
//
// A VQ bound to a port (VQ.Bind) receives SENDs addressed to that port
// (Connect with ConnectOptions.Port) as Messages, popped with PopMsgs in
// arrival order; a SEND_WITH_IMM carries its immediate (Message.HasImm).
// A WRITE_WITH_IMM on a VQ connected to a port writes the bytes into the
// peer's region and then notifies the VQ bound to that port: a Message with
// Write set, the immediate and the byte count, no payload and no posted
// buffer taken, in order with the port's other messages and only once the
// bytes are in place. That is the doorbell of a ring in remote memory (an
// RPC's request ring, a socket's receive buffer): write, then notify.
// PopAnyWait waits for a completion or a message at once: a queue that
// pushes a request and gets its answer at its own port needs one wait.
//
// # Errors
//
// A call's error wraps (%w) one of this package's sentinels, each
// documented where it is declared, and names what failed and why; a
// request's failure is its Completion's verbs.Status (Completion.Err).
// Test them with errors.Is, never by text: errors.Is answers the same for
// an embedded runtime and for a client of krcored, whose daemon carries the
// identity across its socket. Only ErrDaemonGone is one-sided, as only a
// client has a daemon to lose. Some say the call may succeed later, once
// what it needs is free (ErrNoCredit, ErrNoQP, ErrBusy, ErrPortInUse), some
// that a peer or its region is missing (ErrUnreachable, ErrPeerDead,
// ErrNoRegion), some that the call was wrong (ErrInvalid, ErrRefused,
// ErrNotConnected, ErrClosed), and ErrLimit that it asked for more than the
// runtime or the device allows.
package krcore
