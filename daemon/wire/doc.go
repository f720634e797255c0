// Package wire is the protocol between krcored (package daemon) and its
// clients (package client): control messages on a Unix socket, and rings in
// shared memory for the data path.
//
// It holds everything the two sides share, so client imports wire and never
// daemon: the default socket (DefaultSocket), the status document OpStatus
// carries (Status), the counters OpStats carries (PutStats, GetStats) and
// the reports clients keep at the daemon (Report, OpReport, OpReports).
//
// # Control
//
// A client connects to the daemon's SOCK_SEQPACKET Unix socket, so every
// message keeps its boundaries and file descriptors passed with SCM_RIGHTS
// arrive with the message that names them. A message is a 16-byte header
//
//	off size field
//	  0    1 op (OpHello ...)
//	  1    1 code: 0 in requests and successful responses, else an error code
//	         (CodeClosed ...) and the body is the error: its text, then the
//	         names of the sentinels, the WC status and the completion error
//	         it matches (see errors.go), so errors.Is and errors.As answer on
//	         the client as they did in the daemon
//	  2    6 reserved, zero
//	  8    8 sequence number, little-endian; a response repeats its request's
//
// followed by the body: the op's fields in order, integers little-endian
// (u8, u32, u64), strings as a u16 length and the bytes. The client sends
// OpHello first (the daemon refuses any other op before it, and a second
// OpHello) and the daemon answers with the node, the credits of a VQ and
// the largest message. A request may carry descriptors: OpRegister one memfd
// (the memory, sealed against shrinking), OpQueue one memfd (the VQ's rings)
// and three eventfds (doorbell, completion bell, message bell), optionally a
// fourth: the control bell (see Control on the ring). The daemon
// may send OpBye unasked when it shuts down; a client then fails every call
// with krcore.ErrDaemonGone, as it does when the socket closes. The daemon
// answers most requests in the order they came, but the ones that wait for
// another node (OpRegion, OpVQRegion, OpConnect) run beside the others, a
// few at a time, and their answers may come later than those of requests
// sent after them: a client matches responses by sequence number.
//
// # Rings
//
// Each VQ has one memfd the client allocates (RingSize bytes): a 4 KiB
// header of counters, each on its own cache line, then the submission ring
// (SQEntries 64-byte SQEs, client to daemon), the completion ring
// (CQEntries 16-byte CQEs, daemon to client) and the message ring
// (MsgEntries entries of 64 bytes plus the largest message, daemon to
// client). Counters only grow; an index is a counter modulo the ring size.
// A producer writes entries, then stores its tail; a consumer loads the
// tail, reads, then stores its head. Every counter is written by one side
// only, and the daemon treats every value it reads as hostile: a tail more
// than a ring ahead of its head fails the VQ.
//
// A request's completion carries its sequence number (the count of SQEs
// before it), not the client's ID: the client maps it back, so the daemon
// never trusts the client for anything but the SQE itself. The retired
// counter (requests the daemon has finished, unsignaled ones included) is
// what the client's credits are counted against.
//
// # Control on the ring
//
// Added after the first protocol, without renumbering anything: hot control
// operations a VQ user calls often travel on the VQ's submission ring, so
// they cost a shared-memory round trip instead of a socket one. Today that
// is Connect (with or without a port): an SQE with op OpConnectSQE (0xfd),
// MR = the node, Imm = the port and flag FlagToPort (bit 1) when a port is given. The
// daemon runs it in order with the SQEs around it (requests before it go
// where the VQ pointed) and publishes its outcome in the header counter
// CtlDone (line 12) as CtlResult: (sequence number + 1) << 8 | error code
// (CodeOK ...), then rings the control bell if the client's sleep flag
// ClientCtl (line 13) is set. A failed one's error, encoded as on the
// socket, is in the header at byte 1024 (a u16 length, then the body),
// written before CtlDone. A client of the first protocol sent no control
// bell; the daemon then rings the completion bell and checks ClientCQ. The
// client keeps one control SQE in flight per VQ, so CtlDone reports its own;
// a value for an older sequence number is a control SQE it gave up on.
// Rare operations (OpHello, OpRegister, OpQueue, OpRegion, OpExport,
// OpStatus ...) and OpConnect on the socket stay as they were. The daemon
// trusts nothing in a control SQE but its fields' meaning: the node and port
// go to the runtime's Connect as any caller's would, bounded by the call
// timeout, and a slow one holds up only that VQ.
//
// # Wake-ups
//
// A waiter spins for SpinFor, then sets its sleep flag in the header, checks
// again and blocks reading its eventfd; a producer that finds the flag set
// after publishing writes the eventfd. A client waiting for a message after
// a publish that had to ring the doorbell (the daemon slept) sleeps without
// spinning: no message answers before the daemon has woken and the fabric's
// round trip is over. The flag and counters are sequentially
// consistent atomics, so no wake-up is lost, and a side that keeps up never
// makes a system call. A client waiting for a completion or a message at
// once (krcore.VQ.PopAnyWait) sleeps on the message bell with ClientMsg
// set and ClientAny (line 14, added later; a count of such callers, raised
// before a caller takes the bell's token) above zero: a daemon that
// publishes completions rings the message bell too when ClientMsg and
// ClientAny are both not 0 (loaded in that order). A PopMsgsWait that
// holds the bell's token wakes for a completion while ClientAny is not 0
// and leaves the bell to the PopAnyWait queued behind it.
//
// # Features
//
// The daemon's OpHello response ends with a u32 of feature bits (Features)
// after the fields of the first protocol, which clients of that protocol
// ignore; Version stays 1. FeatureClientAny says the daemon honours
// ClientAny. Against a daemon that sends no such word, a client's
// PopAnyWait sleeps in slices of a millisecond, so a completion waits at
// most that long.
package wire
