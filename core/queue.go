package core

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// entry is a request a VQ has accepted and not yet retired.
type entry struct {
	id       uint64
	op       verbs.Opcode
	signaled bool
	done     bool
	status   verbs.Status
	n        uint32
	// mr is the local MR the request uses, held until it finishes so
	// that Deregister leaves its memory to it: by the queue's hold if
	// held (see Queue.hold), else by a use of its own (MR.use).
	mr   *MR
	held bool
}

// Queue is a virtual queue: to its user it behaves like one private RC QP
// (requests complete in order, each VQ sees only its own completions, with
// verbs' status names) while the runtime carries its requests on QPs shared
// with every other VQ of the node.
//
// A Queue is safe for use by several goroutines.
type Queue struct {
	rt    *Runtime
	id    uint32
	port  atomic.Uint32 // the port bound, 0 if none
	waker waker
	group atomic.Pointer[Queue] // a Group's stand-in, kicked with q
	// waiters counts the goroutines in a wait on q (poller.waitReady), so
	// a completion nobody waits for wakes nobody (see kick).
	waiters atomic.Int32
	// nready counts the messages in msgs.ready, changed under mu and read
	// without it by popMsgs.
	nready atomic.Int32

	mu      sync.Mutex
	peer    *peer
	dstPort uint32
	toPort  bool // connected to a port: SEND allowed
	route   *pqp // the physical QP requests currently go to
	// routePeer and routeList are the peer and its list of RC QPs
	// (peer.rcl) route was picked from: while both are current, route is
	// what routeFor picks (the DCIs never change), known without picking.
	routePeer *peer
	routeList *[]*pqp
	ents      []entry
	head      int    // index of the oldest entry in ents
	n         int    // entries in ents
	seq       uint64 // sequence number of ents[head]
	inflight  int    // requests posted to a physical QP and not finished
	held      []rec  // requests waiting for a route switch
	credits   int
	batch     []rec // scratch for Push
	msgs      inbox
	closed    bool
	shut      atomic.Bool // closed, read by waiters without q.mu
	// reconnecting: RC-only mode, the peer lost its RC QPs and a goroutine
	// is getting one for the held requests.
	reconnecting bool
	// reaping: a runtime goroutine reaps the send CQ until held is empty
	// (see reapHeld).
	reaping bool
	// hold is an MR the queue keeps one use of (MR.use) for its requests,
	// holdRefs how many of its entries rely on it: a run of requests on
	// one MR then costs no atomic add and drop each. The use stays while
	// the queue is idle, until the MR is deregistered (dropIdleHold) or
	// the queue closes.
	hold     *MR
	holdRefs int
	// last is what plain last let through on the queue's connection,
	// to check a request that names the same in less (see quick).
	last plainKey
}

// completionDepth is how many credits' worth of completions a VQ holds
// before its user pops them; past it Push waits (or fails) as when out of
// credit.
const completionDepth = 4

// Queue makes a virtual queue.
func (rt *Runtime) Queue() (*Queue, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil, fmt.Errorf("core: queue: %w", krcore.ErrClosed)
	}
	for {
		rt.nextQ++
		if _, taken := rt.queues[rt.nextQ]; !taken && rt.nextQ != 0 {
			break
		}
	}
	q := &Queue{rt: rt, id: rt.nextQ, credits: rt.cfg.Credits}
	rt.queues[q.id] = q
	return q, nil
}

// Connect points the queue at a node. It costs a cached lookup when the
// node is known (warm) and one RDMA READ of the MetaServer when it is not
// (cold): no handshake with the node itself. In RC-only mode (no DC) a
// node without an RC QP in the pool gets one first, within ctx: a UD
// handshake with the node; when the pool is full and no RC peer is idle
// Connect fails with ErrNoQP.
func (q *Queue) Connect(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions) error {
	if opts != nil && opts.Port&portHasImm != 0 {
		// No queue can Bind it, and its bit would read as the flag of a
		// user immediate at the receiver.
		return fmt.Errorf("core: connect to port %#x: reserved: %w", opts.Port, verbs.ErrInvalid)
	}
	p, err := q.rt.peerFor(ctx, node)
	if err == nil {
		if err = p.deadErr(); err != nil {
			err = fmt.Errorf("core: connect: %w", err)
		}
	}
	if err == nil {
		err = q.rt.routes.connect(ctx, p)
	}
	if err != nil {
		return q.connectErr(node, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.movable(node, p); err != nil { // pushed or closed meanwhile
		return err
	}
	q.peer, q.dstPort, q.toPort, q.last = p, 0, false, plainKey{}
	if opts != nil && opts.Port != 0 {
		q.dstPort, q.toPort = opts.Port, true
	}
	q.rt.count(&q.rt.stats.connects)
	return nil
}

// connectErr is the error of a Connect whose lookup or route failed with
// err: the queue's own reason (closed, busy) comes first, as it would had
// the queue been checked before the lookup, so a Connect fails the same
// embedded and through krcored, whose client checks the queue first. It is
// checked only on failure, to keep a warm Connect at one lock of q.mu.
func (q *Queue) connectErr(node krcore.NodeID, err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if qerr := q.movable(node, nil); qerr != nil {
		return qerr
	}
	return err
}

// movable is nil when the queue may be connected to node: it is open, and
// has no request outstanding or node is the one it is connected to. p, if
// known, is node's peer record: one that replaced the record the queue's
// requests use (the node forgotten and learned again) counts as another
// node. q.mu held.
func (q *Queue) movable(node krcore.NodeID, p *peer) error {
	switch {
	case q.closed:
		return fmt.Errorf("core: connect: %w", krcore.ErrClosed)
	case q.n > 0 && (q.peer.node != node || p != nil && p != q.peer):
		return fmt.Errorf("core: connect queue with %d requests outstanding to node %d: %w", q.n, q.peer.node, verbs.ErrBusy)
	}
	return nil
}

// Push submits requests in order. Malformed requests are refused before
// they reach a shared QP and complete with an error status in their place.
// Each request in flight holds one of the queue's credits until it
// completes. With no credit left (or 4 credits' worth of completions not
// popped) Push returns ErrNoCredit, with how many requests it accepted,
// unless wait is true: then it waits until requests complete (or are
// popped), or ctx ends.
func (q *Queue) Push(ctx context.Context, wait bool, reqs ...krcore.Request) (int, error) {
	// Unlocked on each return, not deferred: this is every request's path.
	q.mu.Lock()
	if err := q.usable(); err != nil {
		q.mu.Unlock()
		return 0, err
	}
	if err := q.routeLocked(ctx); err != nil {
		q.mu.Unlock()
		return 0, err
	}
	start := 0
	switch {
	case len(reqs) == 1 && q.pushDirect(&reqs[0]):
		q.mu.Unlock()
		return 1, nil
	case len(reqs) > 1:
		start = q.pushRun(reqs)
	}
	batch := q.batch[:0]
	for i := start; i < len(reqs); i++ {
		for q.full() {
			q.postBatch(batch)
			batch = batch[:0]
			if !wait {
				q.mu.Unlock()
				return i, fmt.Errorf("core: push: %d outstanding: %w", q.rt.cfg.Credits, krcore.ErrNoCredit)
			}
			if err := q.waitCredit(ctx); err != nil {
				q.mu.Unlock()
				return i, err
			}
		}
		// accept writes only what a request sets, into a zero record.
		if len(batch) < cap(batch) {
			batch = batch[:len(batch)+1]
			batch[len(batch)-1] = rec{}
		} else {
			batch = append(batch, rec{})
			q.batch = batch
		}
		if !q.accept(&reqs[i], &batch[len(batch)-1]) {
			batch = batch[:len(batch)-1]
		}
	}
	q.postBatch(batch)
	q.mu.Unlock()
	return len(reqs), nil
}

// pushDirect accepts r straight into the ring of the queue's route and
// posts it, when nothing stands in the way: a credit free, nothing held
// for a route switch, the route unchanged, the QP working with room and
// nothing backlogged before r. That is every request of a caller that
// waits for each, and it leaves out the scratch batch, whose record was
// written and then copied into the ring. It reports false, having done
// nothing, when the general path must take r; true when r was posted or
// refused (completed with its status). q.mu held.
func (q *Queue) pushDirect(r *krcore.Request) bool {
	if q.full() || !q.routeSettled() {
		return false
	}
	p := q.route
	p.mu.Lock()
	if !p.postsNow() || !p.room() {
		p.mu.Unlock()
		return false
	}
	seq := p.next
	x := &p.recs[p.slot(seq)]
	if !q.accept(r, x) {
		p.mu.Unlock()
		return true
	}
	q.admit(p, x, q.peer.target())
	if x.notify {
		p.notifyWRs(x, seq)
	} else {
		p.oneWR(x, seq)
	}
	p.postWRs()
	p.mu.Unlock()
	return true
}

// admit puts x, accepted into p's next record, in flight to t:
// pushDirect's step between accept and the work request (pushRun's, for
// a run, counts once); q.mu and p.mu held.
func (q *Queue) admit(p *pqp, x *rec, t *target) {
	x.target = t
	q.inflight++
	p.next++
	p.n++
	p.used += x.wrs()
	p.countOps(t.peer, 1)
}

// routeSettled reports whether the queue's requests may go to its route
// as it is: it has one, its peer's record and RC QPs are the ones it was
// chosen for, and nothing is held for a route switch; q.mu held.
func (q *Queue) routeSettled() bool {
	return q.route != nil && len(q.held) == 0 && q.peer == q.routePeer && q.peer.rcl.Load() == q.routeList
}

// pushRun is pushDirect for a batch: it accepts the requests of reqs
// straight into the ring of the queue's route, while credits and the
// QP's room last, and posts them in one posting, whose last work request
// is signaled (as postRecs's). It returns how many requests it took
// (posted or refused); the general path takes the rest, or all when
// something stands in the way (see pushDirect). q.mu held.
func (q *Queue) pushRun(reqs []krcore.Request) int {
	if !q.routeSettled() {
		return 0
	}
	p := q.route
	p.mu.Lock()
	if !p.postsNow() {
		p.mu.Unlock()
		return 0
	}
	t := q.peer.target()
	p.wrs, p.sges = p.wrs[:0], p.sges[:0]
	// Each request takes an entry and at most a credit and a record, so
	// the run's bound on those is decided once; only the send queue's
	// room, two work requests for a notifying WRITE, is checked each time.
	k := min(len(reqs), q.credits, q.depth()-q.n, p.depth-p.n)
	first, i := p.next, 0
	for ; i < k && p.used+2 <= p.depth; i++ {
		seq := p.next
		x := &p.recs[p.slot(seq)]
		if !q.accept(&reqs[i], x) {
			continue // refused: completed in its place, the slot left free
		}
		x.target = t
		p.next++
		p.used += x.wrs()
		if x.notify {
			p.wrs = p.appendWRs(p.wrs, x, seq, false)
			continue
		}
		// appendWRs's one work request, without its call: p.wrs has room
		// for p.depth, more than the send queue's room (p.used) allows.
		p.wrs = p.wrs[:len(p.wrs)+1]
		p.fillWR(&p.wrs[len(p.wrs)-1], x, seq, p.flagsFor(x, false))
	}
	if n := int(p.next - first); n > 0 {
		q.inflight += n
		p.n += n
		p.countOps(t.peer, n)
		p.wrs[len(p.wrs)-1].Flags |= verbs.Signaled // the posting's last, as appendWRs's last
		p.sinceSignal = 0
		p.postWRs()
	}
	p.mu.Unlock()
	return i
}

// postBatch posts the records of q's scratch batch (postLocked) and then
// drops their pointers, so that the scratch keeps no MR or target alive;
// the rest of a record is overwritten whole by the next accept. q.mu held.
func (q *Queue) postBatch(batch []rec) {
	q.postLocked(batch)
	for i := range batch {
		batch[i].q, batch[i].target, batch[i].src = nil, nil, nil
	}
}

// PushOne is Push of one request (see krcore.VQ.PushOne).
func (q *Queue) PushOne(ctx context.Context, wait bool, req krcore.Request) error {
	// pushDirect's case without Push's one-request slice, a copy of req.
	q.mu.Lock()
	if q.usable() == nil && q.rt.dc && q.pushDirect(&req) {
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	_, err := q.Push(ctx, wait, req)
	return err
}

// routeLocked makes sure the queue's peer has a route (in RC-only mode an
// RC QP, which may have been evicted while the queue was idle), making one
// within ctx; q.mu held, released while making it.
func (q *Queue) routeLocked(ctx context.Context) error {
	if q.rt.dc {
		return nil // a DCI always routes: the check the compiler inlines
	}
	return q.routeRC(ctx)
}

// routeRC is routeLocked without DC.
func (q *Queue) routeRC(ctx context.Context) error {
	p := q.peer
	if q.rt.routes.routable(p) {
		return nil
	}
	q.mu.Unlock()
	err := q.rt.routes.connect(ctx, p)
	q.mu.Lock()
	if err != nil && p.dead.Load() == nil {
		return err
	}
	return q.usable() // a dead peer's requests are refused (accept)
}

// CanPush reports whether Push would accept a request now without waiting
// for a credit.
func (q *Queue) CanPush() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.full()
}

// full reports that the queue may accept no request now: all its credits
// are in flight, or its completions wait to be popped; q.mu held.
func (q *Queue) full() bool { return q.credits == 0 || q.n == q.depth() }

// depth is how many entries the queue's completion ring holds (ents, nil
// until the queue's first request).
func (q *Queue) depth() int { return completionDepth * q.rt.cfg.Credits }

func (q *Queue) usable() error {
	if !q.closed && q.peer != nil {
		return nil // the check the compiler inlines; the errors are built apart
	}
	return q.unusable()
}

// unusable is usable's error.
func (q *Queue) unusable() error {
	switch {
	case q.closed:
		return fmt.Errorf("core: queue: %w", krcore.ErrClosed)
	case q.peer == nil:
		return krcore.ErrNotConnected
	}
	return nil
}

// waitCredit releases q.mu until a credit returns; q.mu is held.
func (q *Queue) waitCredit(ctx context.Context) error {
	q.mu.Unlock()
	err := q.rt.sends.wait(ctx, q, func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.reap()
		return !q.full() || q.closed
	}, nil)
	q.mu.Lock()
	if err == nil {
		err = q.usable()
	}
	return err
}

// accept checks a request, takes a credit and records an entry for it. It
// fills in x, a zero record, the record to post and reports true, unless
// the request was refused (x left as it was). A physical QP's free
// records are zero (each is zeroed as it retires: TestFreeRecsZero), and
// so are Push's scratch records once reset: accept writes only the fields
// the request sets.
func (q *Queue) accept(r *krcore.Request, x *rec) bool {
	// The rare cases (the first request, a refusal, an MR not the queue's
	// hold) are calls: inline, their code sat between the common case's
	// and took a third more of its cache lines (MEASUREMENTS.md, "Runtime
	// cost", session 22).
	if q.ents == nil {
		q.makeEnts()
	}
	seq := q.seq + uint64(q.n)
	// Resolved once: every check and the post use these records.
	m, g, ok := q.quick(r)
	var ref *refusal
	if !ok {
		m, g, ref = q.vet(r)
	}
	if ref == nil && q.peer.dead.Load() != nil {
		ref = deadRefusal
	}
	held := false
	if ref == nil && r.Local.Len > 0 {
		if m == q.hold && m.live() {
			// holdMR's common case, without the call.
			q.holdRefs++
			held = true
		} else {
			held, ref = q.holdFor(m)
		}
	}
	// The entry is written once, what it holds decided.
	e := &q.ents[q.slot(q.n)]
	q.n++
	if ref != nil {
		q.refuse(e, r, seq, ref)
		return false
	}
	q.credits--
	x.q, x.seq, x.op, x.signaled = q, seq, r.Op, !r.Unsignaled
	x.imm, x.cmp, x.swap = r.Imm, r.Compare, r.Swap
	var em *MR
	var en uint32
	if r.Local.Len > 0 {
		x.local, x.hasLocal = sge(m, r.Local), true
		// Released as it finishes; a success's length (see retireRange).
		em, en = m, x.local.Length
	}
	*e = entry{id: r.ID, op: r.Op, signaled: x.signaled, mr: em, held: held, n: en}
	if r.Op.IsSend() {
		x.dstPort, x.msgImm = q.dstPort, r.Op == verbs.OpSendImm
		if r.Local.Len > 0 && r.Local.Len <= hdrPayload {
			x.src = m
		}
	} else {
		x.raddr, x.rkey = g.addr+r.Remote.Off, g.rkey
	}
	if r.Op == verbs.OpWriteImm {
		x.dstPort, x.notify = q.dstPort, true
	}
	return true
}

// makeEnts makes the completion ring at the queue's first request, not
// with the queue: a queue that is only connected, or only receives
// messages, costs no ring (16 KiB at the default credits, zeroed and
// scanned by the GC); q.mu held. Not inlined: accept's cold path.
//
//go:noinline
func (q *Queue) makeEnts() { q.ents = make([]entry, q.depth()) }

// holdFor is accept's holdMR for an MR other than the queue's live hold:
// whether the queue's hold serves the request, or why it is refused.
func (q *Queue) holdFor(m *MR) (bool, *refusal) {
	held, ok := q.holdMR(m)
	if !ok {
		return false, &refusal{verbs.LocProtErr, "local MR deregistered"}
	}
	return held, nil
}

// refuse records request r, refused for ref, in entry e at sequence seq
// and completes it in its place; q.mu held.
func (q *Queue) refuse(e *entry, r *krcore.Request, seq uint64, ref *refusal) {
	*e = entry{id: r.ID, op: r.Op, signaled: !r.Unsignaled}
	q.rt.count(&q.rt.stats.refusals)
	q.finishLocked(seq, ref.status, 0)
}

// vet resolves r's handles to the runtime's records and checks r, a
// request quick did not let through: nil, or why it is refused. What plain
// lets through it remembers for quick; q.mu held.
func (q *Queue) vet(r *krcore.Request) (*MR, *grant, *refusal) {
	m, g := q.rt.ownMR(r.Local.MR), grantOf(r.Remote.Region)
	if plain(r, m, g, q.rt, q.peer.node, q.toPort, q.rt.lim) {
		q.last = plainKey{m: m, g: g, op: r.Op}
		return m, g, nil
	}
	ref := q.checkOwner(r, m, g)
	if ref == nil {
		ref = check(r, m, g, q.toPort, q.rt.lim)
	}
	return m, g, ref
}

// postLocked sends records to the queue's route, switching routes only when
// nothing is in flight so requests never overtake each other; q.mu held.
func (q *Queue) postLocked(batch []rec) {
	if len(batch) == 0 && len(q.held) == 0 {
		return
	}
	list := q.peer.rcl.Load()
	want := pickQP(q.id, rcsOf(list), q.rt.dcis)
	switch step(q.route, want, q.inflight) {
	case stepReconnect:
		q.held = append(q.held, batch...)
		q.reconnect()
		return
	case stepHold:
		q.held = append(q.held, batch...)
		q.reapHeld()
		return
	case stepMigrate:
		q.rt.count(&q.rt.stats.migrations)
	}
	q.route, q.routePeer, q.routeList = want, q.peer, list
	if len(q.held) > 0 {
		batch = append(q.held, batch...)
		q.held = nil
	}
	t := q.peer.target()
	for i := range batch {
		batch[i].target = t
	}
	q.inflight += len(batch)
	lost := want.post(batch)
	q.inflight -= len(lost)
	if len(lost) > 0 {
		q.rt.routes.lost(q, lost)
	}
}

// reapHeld makes the requests q holds for a new route go out once the
// ones in flight complete, whether or not anyone polls q: a posted request
// runs without its CQ being polled, and a caller may push and then wait
// only for the peer's answer (a message). A runtime goroutine waits on the
// send CQ, as any waiter would, until q holds nothing; q.mu held.
func (q *Queue) reapHeld() {
	if q.reaping {
		return
	}
	q.reaping = true
	q.rt.background(func() {
		ctx, cancel := q.rt.untilStop()
		defer cancel()
		holdsNothing := func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.held) == 0 || q.closed
		}
		for {
			err := q.rt.sends.waitReady(ctx, q, holdsNothing, nil)
			q.mu.Lock()
			if err != nil || len(q.held) == 0 || q.closed {
				q.reaping = false
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
		}
	})
}

// finish records a physical outcome; called by the poller.
func (q *Queue) finish(seq uint64, st verbs.Status, n uint32) {
	q.finishRun([]finished{{q: q, seq: seq, status: st, n: n}})
}

// finishRun records the physical outcomes of q's requests in fs, under
// one lock of q.mu and with one wake-up: a signaled completion retires
// every unsignaled request before it on the QP.
func (q *Queue) finishRun(fs []finished) {
	q.mu.Lock()
	q.finishRunLocked(fs)
	q.mu.Unlock()
}

// finishRunLocked is finishRun with q.mu held.
func (q *Queue) finishRunLocked(fs []finished) {
	if len(fs) == 0 {
		return
	}
	for _, f := range fs {
		q.inflight--
		q.credits++
		q.markDone(f.seq, f.status, f.n)
	}
	q.settle()
}

// settle follows requests finishing: it wakes q's waiters, and posts
// what q held for a new route once nothing is in flight; q.mu held.
func (q *Queue) settle() {
	q.rt.kick(q)
	if q.inflight == 0 && len(q.held) > 0 {
		q.postLocked(nil)
	}
}

// finishLocked marks entry seq done and wakes a waiting Pop; q.mu held.
func (q *Queue) finishLocked(seq uint64, st verbs.Status, n uint32) {
	q.markDone(seq, st, n)
	q.rt.kick(q)
}

// markDone marks entry seq done, releasing its MR; q.mu held. Its waiter
// is the caller's to wake.
func (q *Queue) markDone(seq uint64, st verbs.Status, n uint32) {
	i := int(seq - q.seq)
	if i < 0 || i >= q.n {
		return
	}
	e := &q.ents[q.slot(i)]
	if !e.done {
		q.release(e)
	}
	e.done, e.status, e.n = true, st, n
}

// release releases the MR of e, an entry not yet done; q.mu held.
func (q *Queue) release(e *entry) {
	if m := e.mr; m != nil {
		e.mr = nil
		// A request relying on the queue's hold releases it; the hold
		// goes with the last one once m is deregistered or the queue
		// closed. One with a use of its own drops it.
		if !e.held {
			m.unuse()
		} else {
			q.releaseHeld(1) // m is the hold: it changes only when unheld
		}
	}
}

// releaseHeld releases n requests relying on the queue's hold (release's
// for one, retireRange's for a range); q.mu held.
func (q *Queue) releaseHeld(n int) {
	if q.holdRefs -= n; q.holdRefs == 0 && (q.closed || !q.hold.live()) {
		q.dropHold(q.hold)
	}
}

// holdMR holds m, live, for a request: by the queue's hold if m is its MR
// or it has none in use (held true), else by a use of its own. It fails
// once m is deregistered; q.mu held.
func (q *Queue) holdMR(m *MR) (held, ok bool) {
	if m == q.hold {
		if !m.live() {
			q.dropIdleHold(m)
			return false, false
		}
		q.holdRefs++
		return true, true
	}
	if !m.use() {
		return false, false
	}
	if q.holdRefs > 0 {
		return false, true // the hold serves other requests: m's use is the request's
	}
	if q.hold != nil {
		q.hold.unuse()
	}
	q.hold, q.holdRefs = m, 1
	return true, true
}

// dropHold drops the queue's hold of m; q.mu held.
func (q *Queue) dropHold(m *MR) {
	q.hold = nil
	m.unuse()
}

// dropIdleHold drops the queue's hold of m if no request relies on it;
// q.mu held. Deregister calls it for every queue, so an idle queue does
// not keep a deregistered MR.
func (q *Queue) dropIdleHold(m *MR) {
	if q.hold == m && m != nil && q.holdRefs == 0 {
		q.hold = nil
		m.unuse()
	}
}

// flushLocked fails records that are not in flight with WR_FLUSH_ERR,
// returning their credits; q.mu held.
func (q *Queue) flushLocked(rs []rec) {
	for _, r := range rs {
		q.credits++
		q.finishLocked(r.seq, verbs.WRFlushErr, 0)
	}
}

// reap retires unsignaled successes at the head, returning their credits;
// q.mu held.
func (q *Queue) reap() {
	for q.n > 0 {
		e := &q.ents[q.head]
		if !e.done || e.signaled || e.status != verbs.Success {
			return
		}
		q.pop()
	}
}

// slot is the index in ents of the i-th entry from the head (0 <= i <
// len(ents)): a compare, not a division, on the path of every request.
func (q *Queue) slot(i int) int {
	j := q.head + i
	if j >= len(q.ents) {
		j -= len(q.ents)
	}
	return j
}

// pop retires the entry at the head; q.mu held.
func (q *Queue) pop() {
	q.head = q.slot(1)
	q.n--
	q.seq++
	if q.n == 0 {
		// The next entry takes slot 0: a caller that waits for each
		// request reuses one line instead of walking the ring.
		q.head = 0
	}
}

// Pop moves finished requests' completions into out, in push order, and
// returns how many. It never blocks: it polls the node's completion queue
// itself, so a spinning caller needs no other goroutine.
func (q *Queue) Pop(out []krcore.Completion) int {
	var mine ownRun
	q.rt.sends.pollFor(q, &mine, nil)
	q.mu.Lock()
	k := 0
	if mine.n > 0 || mine.span > 0 {
		k = q.finishOwn(&mine, out)
	}
	if q.n > 0 && k < len(out) {
		k += q.popLocked(out[k:])
	}
	q.mu.Unlock()
	return k
}

// finishOwn records the outcomes of q's requests that a poll handed to
// Pop (see pollFor) and wakes q's waiters, as finishRunLocked does. The
// first, when it is the oldest request of the queue and out has room, it
// retires at once into out, without marking its entry done for popLocked
// to find. mine holds one at least. It returns how many completions it
// put in out; q.mu held.
func (q *Queue) finishOwn(mine *ownRun, out []krcore.Completion) int {
	if mine.span > 0 {
		return q.finishRange(mine, out)
	}
	k, fs := 0, mine.fs[:mine.n]
	q.inflight -= len(fs)
	q.credits += len(fs)
	if o := &fs[0]; o.seq == q.seq && q.n > 0 && len(out) > 0 && !q.ents[q.head].done {
		e := &q.ents[q.head]
		q.release(e)
		if e.signaled || o.status != verbs.Success {
			out[0] = krcore.Completion{ID: e.id, Op: e.op, Status: o.status, Len: int(o.n)}
			k = 1
		}
		q.pop()
		fs = fs[1:]
	}
	for i := range fs {
		q.markDone(fs[i].seq, fs[i].status, fs[i].n)
	}
	q.rt.kick(q)
	if q.inflight == 0 && len(q.held) > 0 {
		q.postLocked(nil)
	}
	return k
}

// finishRange is finishOwn for a poll that handed Pop a range of
// successes (see completeRun): it retires the range (retireRange), then
// records the rest of mine as finishRunLocked does. It returns how many
// completions it put in out; q.mu held.
func (q *Queue) finishRange(mine *ownRun, out []krcore.Completion) int {
	k := q.retireRange(mine.lo, mine.span, out)
	q.inflight -= mine.n + mine.span
	q.credits += mine.n + mine.span
	for _, o := range mine.fs[:mine.n] {
		q.markDone(o.seq, o.status, o.n)
	}
	q.settle()
	return k
}

// retireRange retires the successes of the n entries from sequence number
// lo, in flight until now: from the head of the queue straight into out
// while it has room (no entry marked done for popLocked to find), in one
// pass over the ring with the queue's counters moved once, and the rest
// marked done. It returns how many completions it put in out; q.mu held.
func (q *Queue) retireRange(lo uint64, n int, out []krcore.Completion) int {
	k, c := 0, 0
	if q.seq == lo {
		j, held, ents := q.head, 0, q.ents
		for ; c < n && k < len(out); c++ {
			e := &ents[j]
			if e.done {
				break // cannot be, for a request in flight; markDone's way below
			}
			if m := e.mr; m != nil {
				if e.mr = nil; e.held {
					held++
				} else {
					m.unuse()
				}
			}
			if e.signaled {
				out[k] = krcore.Completion{ID: e.id, Op: e.op, Status: verbs.Success, Len: int(e.n)}
				k++
			}
			if j++; j == len(ents) {
				j = 0
			}
		}
		q.head, q.n, q.seq = j, q.n-c, q.seq+uint64(c)
		if q.n == 0 {
			q.head = 0 // see pop
		}
		if held > 0 {
			q.releaseHeld(held)
		}
	}
	for ; c < n; c++ {
		s := lo + uint64(c)
		q.markDone(s, verbs.Success, q.ents[q.slot(int(s-q.seq))].n)
	}
	return k
}

func (q *Queue) popReady(out []krcore.Completion) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.popLocked(out)
}

// popLocked is popReady with q.mu held. A pop that makes room in a full
// ring wakes q's waiters: a Push may wait for that room (see full), with
// nothing in flight whose completion would wake it.
func (q *Queue) popLocked(out []krcore.Completion) int {
	full := q.n > 0 && q.n == len(q.ents)
	k := 0
	for k < len(out) && q.n > 0 {
		e := &q.ents[q.head] // read in place: pop's copy costs more than the rest
		if !e.done {
			break
		}
		if e.signaled || e.status != verbs.Success {
			out[k] = krcore.Completion{ID: e.id, Op: e.op, Status: e.status, Len: int(e.n)}
			k++
		}
		q.pop()
	}
	if full && q.n < len(q.ents) {
		q.rt.kick(q)
	}
	return k
}

// PopWait is Pop that waits for at least one completion, spinning briefly
// and then sleeping, until ctx ends. An empty out could never take one:
// it is refused at once (verbs.ErrInvalid).
func (q *Queue) PopWait(ctx context.Context, out []krcore.Completion) (int, error) {
	if len(out) == 0 {
		return 0, fmt.Errorf("core: pop wait: no room for a completion: %w", verbs.ErrInvalid)
	}
	var n int
	err := q.rt.sends.wait(ctx, q, func() bool {
		n = q.popReady(out)
		return n > 0
	}, nil)
	return n, err
}

// Outstanding is the number of requests pushed and not yet retired.
func (q *Queue) Outstanding() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Close releases the queue: it unbinds its port; requests in flight
// complete as they finish, and those it held for a new route (never
// posted) with WR_FLUSH_ERR.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return fmt.Errorf("core: queue: %w", krcore.ErrClosed)
	}
	q.closed = true
	q.shut.Swap(true) // a store no later load passes, even under the race detector, before kick reads waiters
	q.failHeld()      // nothing posts them now: reapHeld leaves on closed
	q.dropBufs(nil)
	q.dropIdleHold(q.hold)
	q.mu.Unlock()
	q.Unbind()
	rt := q.rt
	rt.mu.Lock()
	delete(rt.queues, q.id)
	rt.mu.Unlock()
	rt.kick(q) // its waiters, wherever they sleep, fail with ErrClosed
	return nil
}

// isClosed reports whether Close was called.
func (q *Queue) isClosed() bool { return q.shut.Load() }
