// Package core is the KRCore runtime: a node-level layer that shares a small
// set of RDMA queue pairs among every goroutine (and, through krcored, every
// process) on the node, and connects to any other node in microseconds.
//
// # Model
//
// A Runtime owns one device and everything shared on the node: a DC target
// (DCT) registered in the MetaServer, a pool of DC initiators (DCIs, one per
// core by default), an RC pool keyed by peer, the virtual-queue table and a
// meta cache. Users work with virtual queues (Queue): each behaves like one
// private RC QP (its requests complete in order, it sees only its own
// completions, with verbs' status names) while the runtime multiplexes all
// VQs onto the shared QPs.
//
// Connect costs no handshake: the peer's DC target (address, DCT number, DC
// key) comes from the meta cache (warm) or one RDMA READ of the MetaServer
// (cold). Traffic starts on the VQ's DCI; when a peer is hot the runtime
// builds an RC QP to it in the background and moves its VQs over once their
// DC requests have drained, so nothing is lost or reordered; under the
// per-node budget (K QPs for each of N peers) cold RC QPs go back to DC.
// Only the node that built an RC QP evicts it, and only once the other end
// says it has been idle as long: the accepting end cannot see the
// builder's one-sided traffic, and either end may push over the QP.
//
// # Control path
//
// Runtimes talk to each other (region lookups, RC set-up and tear-down)
// over UD, through package udrpc, to the control QP each node publishes in
// its MetaServer record: no DC and no connection is needed, and a lost
// datagram is sent again under the same request id (RC set-up answers a
// copy with the QP it already made).
//
// # Dead peers
//
// A peer whose requests time out (RETRY_EXC_ERR) or whose control call
// goes unanswered is judged: the runtime pings its control QP and its own
// at once, 160 ms a round, and the peer is dead once it has left three
// pings unanswered while the runtime answered its own (a runtime starved
// of CPU times out requests to live peers; what it learns then is that it
// did not run). A dead peer is so known within 480 ms of the judgement's
// start on a runtime that runs, and after ten rounds (1.6 s by its own
// timers) on one that hardly runs, the peer silent in each; a peer whose
// request timed out and whose record the MetaServer no longer has, at
// once. Until it answers again, Connect and control calls to it fail at
// once with an error wrapping ErrPeerDead, and requests to it complete at
// once with RETRY_EXC_ERR, instead of each waiting out a timeout. A probe
// owned by the runtime refetches its record and pings it, backing off to
// once a second; a restarted node is found by the next probe.
//
// # RC-only mode
//
// A device without DC (kernel soft-RoCE, rxe; DeviceAttr.DCSupported false),
// or Config.RCOnly, runs the runtime on its RC pool alone: no DCT, no DCIs,
// a record with DCT number 0, and the meta client READs the MetaServer over
// an RC QP it sets up once with a UD handshake and keeps (a cold lookup is
// still one READ). Connect then needs an RC QP to the peer: warm, one is
// pooled (an atomic load); cold, Connect builds one within its context (a
// UD handshake: the peer creates and connects its end). The budget holds:
// with N peers holding RC QPs, a new peer takes the place of the coldest
// peer whose RC QPs are idle (its VQs get a new one when they next push),
// and when every holder is busy Connect fails with ErrNoQP. RC QPs are not
// evicted for being cold, only for room. Every data-path guarantee stays:
// ordered completions, per-VQ dispatch, protection, credits; an RC QP that
// errors is replaced by a new one to the same peer, the culprit's requests
// fail and everyone else's are reposted on it in order.
//
// # Protection
//
// A shared QP is fragile: one bad request moves it to the error state and
// flushes everyone's work. The runtime therefore checks every request
// before it reaches a shared QP (local range inside the caller's MR with the
// needed access, remote range inside a granted region with its access,
// opcode valid for the connection, sizes and alignment) and refuses it with
// an error completion to that VQ only. Per-VQ credits bound what a VQ may
// have outstanding, and physical QPs are signaled often enough that their
// send queues never fill. A QP that errors anyway (a region revoked, a peer
// gone) is reset and reconnected: only the culprit's requests fail, every
// other VQ's requests are reposted in order.
//
// The checks never rest on what a caller can edit. A Region is an opaque
// handle on the runtime's own record of the grant, so a Region the runtime
// did not hand out (the zero value, another runtime's) is refused before
// it reaches a shared QP. And where the memory lives, an export is its own
// MR over exactly the exported bytes with exactly the exported rights: the
// rkey a client learns reaches nothing else, and the exporter's RNIC
// refuses the rest with REM_ACCESS_ERR (Unexport and Deregister revoke
// it). An export to an audience answers only a lookup carrying one of its
// principals: the asking node, and the port of the asking queue, which the
// asking runtime reads from the queue itself. An MR is held by every request using it until that request
// finishes: Deregister refuses new requests at once but leaves the
// registration and the memory to the ones already on a shared QP, which
// pulling it from under them would fail and break the QP for everyone.
//
// # Inspection
//
// Stats counts what the runtime did; PoolQPs lists its shared QPs one by
// one (type, number, peer, the state the runtime tracks: ready,
// connecting, draining, closing, recovering, error; the VQs routed to each
// and its requests in flight) and MetaEntries the meta cache's records.
// All three are read-only snapshots taken under the runtime's own locks;
// krcored's status (krctl) is built from them.
//
// # Completions
//
// There are no background pollers: Pop and PopWait poll the node's single
// completion queue themselves and dispatch what they find to every VQ
// (wr_id carries the VQ). A waiter spins briefly, then sleeps; one sleeper
// at a time waits on the completion queue for everyone. On a device that
// makes progress in the thread that waits (verbs.DeviceAttr.ProgressInWait:
// the soft RNIC, whose waiter reads the wire) waiters do not spin. Closing
// a queue (or the runtime) wakes its waiters, wherever they sleep, and
// fails them with ErrClosed once what had finished is popped. A Group
// lets one goroutine wait for many queues (krcored's per-client pump).
package core
