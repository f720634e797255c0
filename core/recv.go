package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/fifo"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// receiver owns the receive buffers every port shares: one SRQ serves the
// DCT and every RC QP, and messages are copied from its slots to the bound
// queue's posted buffers.
type receiver struct {
	rt   *Runtime
	mr   *MR
	base int // offset of slot 0 in mr: huge-page aligned
	slot int
	// spent[:nspent] are the slots whose messages were dispatched,
	// waiting to be posted again together once there are batch of them
	// (see release);
	// wrs is that post's scratch (a provider copies what it is posted)
	// and sgl every slot's scatter-gather entry, made once. spent, wrs
	// and the last* fields are guarded by the receive poller's lock,
	// under which every receive completion is dispatched (onWC).
	spent  []int
	nspent int
	batch  int
	wrs    []verbs.RecvWR
	sgl    []verbs.SGE
	// lastView, lastPort and lastQ remember the queue the last message
	// went to (see lookup).
	lastView *map[uint32]*Queue
	lastPort uint32
	lastQ    *Queue
}

// repostBatch is how many dispatched slots are posted to the SRQ at once.
// A post per message took the SRQ's lock and wrote its ring once per
// message, lines the sender's side of the RNIC had just written taking the
// slot; in one process they moved between the two cores on every message.
// At most repostBatch-1 slots are out of the SRQ at a time.
const repostBatch = 16

// newReceiver registers the slots and posts every one. They are populated
// first (offheap.Populate), on huge pages where the system has them: a
// message lands in whichever slot the SRQ hands out (on hardware the
// oldest posted, so every slot in turn; on the soft RNIC the newest), and
// a page faulting at its first message put ~20 us on each of a fresh
// runtime's first RecvSlots messages on a VM when the SRQ handed them out
// in turn (a 64 B SEND round trip in one process: ~30 us for its first
// 1000 round trips, then 5 us). The MR has a huge page of slack
// so that the slots can start on a huge page boundary.
func newReceiver(rt *Runtime) (*receiver, error) {
	slot := max(hdrLen+rt.cfg.MaxMessage, notifyLen)
	size := slot * rt.cfg.RecvSlots
	mr, err := rt.RegMR(size+offheap.HugePage, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mr.Bytes())))
	base := int((offheap.HugePage - start%offheap.HugePage) % offheap.HugePage)
	offheap.Populate(mr.Bytes()[base : base+size])
	// Small SRQs (a test's few slots) keep most of their slots posted.
	r := &receiver{rt: rt, mr: mr, base: base, slot: slot, batch: max(1, min(repostBatch, rt.cfg.RecvSlots/16))}
	r.sgl = make([]verbs.SGE, rt.cfg.RecvSlots)
	r.spent, r.nspent = make([]int, rt.cfg.RecvSlots), rt.cfg.RecvSlots
	for i := range r.sgl {
		r.sgl[i] = sge(mr, mr.Range(base+i*slot, slot))
		r.spent[i] = i
	}
	if err := r.repost(); err != nil {
		rt.Deregister(mr)
		return nil, err
	}
	r.spent, r.wrs = make([]int, r.batch), make([]verbs.RecvWR, 0, r.batch) // the scratch of one batch from now on
	return r, nil
}

// slotBytes is slot i's first n bytes.
func (r *receiver) slotBytes(i, n int) []byte {
	off := r.base + i*r.slot
	return r.mr.mem[off : off+n] // the runtime's own MR (see MR.mem)
}

// release returns slot i, whose message was dispatched, to the SRQ: with
// the next ones, once batch of them wait.
func (r *receiver) release(i int) {
	// Not append: spent never outgrows batch, and append's growing
	// path sat among the lines every message runs.
	r.spent[r.nspent] = i
	r.nspent++
	if r.nspent >= r.batch {
		r.repost() // fails only when the SRQ is gone: the runtime is closing
	}
}

// repost posts the spent slots to the SRQ.
func (r *receiver) repost() error {
	r.wrs = r.wrs[:0]
	for _, i := range r.spent[:r.nspent] {
		r.wrs = append(r.wrs, verbs.RecvWR{ID: recvBit | uint64(i), SGL: r.sgl[i : i+1 : i+1]})
	}
	r.nspent = 0
	_, err := r.rt.srq.PostRecv(r.wrs)
	return err
}

// onWC dispatches a receive completion by its opcode and releases its
// slot; a message to self's port goes to msgs if it can (see
// Queue.deliverTo). Only a SEND carries
// a message: the runtime's own SENDs travel as SEND_WITH_IMM whose
// immediate names the destination port, behind a header; a header marked
// hdrWrite is the notification of a runtime's WRITE_WITH_IMM. A raw
// WRITE_WITH_IMM (a runtime never posts one) consumes a slot too, but its
// bytes went to the writer's target, not to the slot, which still holds
// whatever an earlier SEND left there: it is counted and its slot
// released, never read.
func (r *receiver) onWC(wc *verbs.WC, self *Queue, msgs *ownMsgs) {
	i := int(wc.ID &^ recvBit)
	if c := r.dispatch(wc, i, self, msgs); c != nil {
		r.rt.count(c)
	}
	r.release(i)
}

// dispatch is onWC's work for the completion wc of slot i, but the slot's
// release and the count: it returns the counter of what it did with a
// completion that delivered no message (a raw WRITE_WITH_IMM, a message
// dropped), or nil. Counted by the caller, once, so that the counts'
// code is not among the lines every delivered message runs.
func (r *receiver) dispatch(wc *verbs.WC, i int, self *Queue, msgs *ownMsgs) *atomic.Uint64 {
	switch {
	case wc.Status != verbs.Success:
		return nil
	case wc.Op == verbs.WCRecvWriteImm:
		return &r.rt.stats.writeImms
	case wc.Op != verbs.WCRecv || !wc.HasImm || wc.ByteLen < hdrLen:
		return &r.rt.stats.dropped
	}
	b := r.slotBytes(i, int(wc.ByteLen))
	le := binary.LittleEndian
	from := le.Uint32(b[8:])
	m := krcore.Message{
		From: le.Uint64(b), Port: from &^ hdrWrite,
		Imm: le.Uint32(b[12:]), HasImm: wc.Imm&portHasImm != 0,
	}
	data := b[hdrLen:]
	if from&hdrWrite != 0 {
		if len(data) != notifyLen-hdrLen {
			return &r.rt.stats.dropped
		}
		m.Write, m.Len, data = true, int(le.Uint32(data)), nil
	}
	port := wc.Imm &^ portHasImm
	if view := r.rt.portView.Load(); view != r.lastView || port != r.lastPort {
		r.lookup(view, port)
	}
	q := r.lastQ
	if q != self {
		msgs = nil // for self's PopMsgs only
	}
	if q == nil || !q.deliverTo(&m, data, msgs) {
		return &r.rt.stats.dropped
	}
	return nil
}

// lookup finds the queue bound to port in table view (nil before the
// first Bind) for dispatch, which remembers the last one found with the
// table it was found in: a port's messages come in runs, and a map lookup
// was a third of a message's dispatch; a table replaced (Bind, Unbind) is
// looked up again. Apart, so that the map access's call is not among the
// lines a run of one port's messages runs. The receive poller's lock held.
//
//go:noinline
func (r *receiver) lookup(view *map[uint32]*Queue, port uint32) {
	r.lastView, r.lastPort, r.lastQ = view, port, nil
	if view != nil {
		r.lastQ = (*view)[port]
	}
}

func (r *receiver) close() { r.rt.Deregister(r.mr) }

// serveRecvs is the runtime's own waiter on the receive completion queue,
// until the runtime stops. A slot of the shared SRQ is posted again only
// when its completion is dispatched (onWC), and before this goroutine that
// happened only when an application polled or waited for messages: a node
// whose applications never did (a server of one-sided requests that a
// client sends WRITE_WITH_IMM to, or a SEND to an unbound port) ran out of
// slots after RecvSlots messages. Every QP carrying a message to it then
// got RNR NAKs for good (the RNR retry count is infinite) and, being
// shared, held every other VQ's requests behind that message: the hang
// of TestMalformedNeighbours/rc-only. Like a kernel's completion handler,
// this waiter keeps the SRQ stocked whoever polls: it sleeps on the queue
// only while no application waits for messages there (any such waiter
// displaces it, and it never displaces one) and it never spins.
//
// A waiter on the queue is woken for every completion, though: in one
// process, where an application spinning on PopMsgs dispatches each
// message itself, that was a goroutine made runnable per message for
// nothing (~0.8 us of a 64 B SEND round trip's 3.6-3.8 us). So a wake-up
// that finds the queue already drained rests it off the queue (see rest)
// while nothing sleeps in the runtime's waits and the queue's completions
// need no waiter to arrive.
func (rt *Runtime) serveRecvs() {
	defer rt.wg.Done()
	ctx, cancel := rt.untilStop()
	defer cancel()
	pl := rt.recvs
	q := pl.own
	q.waiters.Add(1) // for good: a waiter that displaces it kicks q
	token := false
	var displaced *Queue // stays nil: this waiter never displaces
	defer func() {
		if token {
			pl.passRole()
		}
	}()
	polled := func() bool { return pl.poll() > 0 }
	woken := false // the last sleep ended without dispatching anything
	for {
		if polled() {
			woken = false
			continue
		}
		if woken && rt.rest.may(pl) {
			if err := rt.rest.rest(ctx, pl, polled); err != nil {
				return
			}
			woken = false
			continue
		}
		done, err := pl.sleep(ctx, q, polled, &token, &displaced)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, krcore.ErrClosed) {
				rt.log.Warn("receive queue no longer served", "err", err)
			}
			return
		}
		woken = !done
	}
}

// rester keeps the state of serveRecvs's rests off the receive completion
// queue. A rest lasts while other goroutines poll the queue (PopMsgs
// dispatches every completion it finds, whichever port it is for) and
// nothing sleeps in the runtime's waits: a waiter that goes to sleep
// (waitReady) may be waiting for a message nobody polls for, and ends the
// rest at once. Each restRound serveRecvs polls the queue itself; it goes
// back to sleeping on it when it finds completions there (nobody else
// polled them) or nobody dispatched any in the round.
type rester struct {
	sleepers atomic.Int32  // goroutines asleep in waitReady
	resting  atomic.Bool   // serveRecvs is off the queue
	nudge    chan struct{} // ends a rest (buffered, one token)
	timer    *time.Timer   // serveRecvs's rounds; only it uses it
}

// restRound is how long serveRecvs rests before it looks at the queue
// (a variable for tests).
var restRound = time.Millisecond

// progressesAlone is a CQ that can tell whether its completions arrive
// without a goroutine waiting on it (the soft RNIC's in-memory wire, where
// a request completes in its poster's goroutine; not its TCP and
// shared-memory links, whose frames a waiter reads).
type progressesAlone interface{ ProgressesAlone() bool }

// may reports whether serveRecvs may rest off pl's completion queue now.
func (r *rester) may(pl *poller) bool {
	return pl.progressesAlone() && r.sleepers.Load() == 0
}

// sleeping counts a goroutine going to sleep in a wait, ending a rest;
// awake undoes it.
func (r *rester) sleeping() {
	r.sleepers.Add(1)
	if r.resting.Load() { // after the Add: a rest that begins later sees the count
		r.wake()
	}
}

func (r *rester) awake() { r.sleepers.Add(-1) }

// wake ends a rest, or serveRecvs's lazy wait aside (ownAside).
func (r *rester) wake() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// rest keeps serveRecvs off pl's queue while others poll it (see rester),
// until ctx ends (its error is returned).
func (r *rester) rest(ctx context.Context, pl *poller, polled func() bool) error {
	if r.timer == nil {
		r.timer = time.NewTimer(restRound)
	}
	for {
		mark := pl.dispatchedSoFar()
		r.resting.Store(true)
		if r.sleepers.Load() != 0 { // after the Store: see sleeping
			r.resting.Store(false)
			return nil
		}
		r.timer.Reset(restRound)
		select {
		case <-r.nudge:
		case <-r.timer.C:
		case <-ctx.Done():
		}
		r.resting.Store(false)
		r.timer.Stop()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case polled(), pl.dispatchedSoFar() == mark, !r.may(pl):
			return nil
		}
	}
}

// maxInbox bounds the messages a port holds that arrived before a buffer
// was posted for them; past it messages are dropped (and counted).
const maxInbox = 4096

// inbox is a bound queue's receive side.
type inbox struct {
	bufs  bufRing                   // posted receive buffers, in order
	ready fifo.FIFO[krcore.Message] // received, not yet popped
	// hold is an MR the queue keeps one use of (MR.use) for its posted
	// receive buffers: a posted buffer in hold takes no use of its own,
	// one in any other MR does. A port posting its buffers back one by
	// one then costs no atomic add and drop per message. hold is taken
	// only while no buffer is posted (so no buffer in it has a use of
	// its own) and stays while the queue is idle, until the MR is
	// deregistered or the queue closes (dropBufs).
	hold *MR
	// slab hands out the Local a delivered message points to (its Buf):
	// one allocation for slabLen messages. Each element is handed out
	// once, so a message its user keeps never sees its Buf change.
	slab []krcore.Local
}

// bufRing is a port's posted receive buffers, oldest first: a ring whose
// array doubles when full and is never moved otherwise. A buffer is taken
// from the front and posted back at the end for every message; the fifo it
// replaced moved its items down the array now and then, and its pushes and
// drops were generic calls.
type bufRing struct {
	s    []krcore.Local // a power of two long, or empty
	head int
	n    int
}

// slot is the place of the i-th oldest buffer (0 <= i < len(s)).
func (r *bufRing) slot(i int) *krcore.Local { return &r.s[(r.head+i)&(len(r.s)-1)] }

// at is the i-th oldest buffer (0 <= i < n).
func (r *bufRing) at(i int) krcore.Local { return *r.slot(i) }

// full reports that the ring has no room for another buffer (grow).
func (r *bufRing) full() bool { return r.n == len(r.s) }

// put posts b last; the ring is not full. (A push that grew the ring
// itself would not inline: the call costs the inliner more than the rest.)
func (r *bufRing) put(b krcore.Local) {
	r.s[(r.head+r.n)&(len(r.s)-1)] = b
	r.n++
}

// grow doubles the array (at least 8), the buffers moved to its front.
//
//go:noinline
func (r *bufRing) grow() {
	s := make([]krcore.Local, max(8, 2*len(r.s)))
	for i := range r.n {
		s[i] = r.at(i)
	}
	r.s, r.head = s, 0
}

// pop takes the oldest buffer (n > 0).
func (r *bufRing) pop() krcore.Local {
	p := &r.s[r.head]
	b := *p
	*p = krcore.Local{} // it holds no MR once taken
	r.head = (r.head + 1) & (len(r.s) - 1)
	r.n--
	return b
}

// slabLen is how many messages' Buf one allocation of inbox.slab serves.
const slabLen = 32

// bufOf returns a Local holding b that no other message points to.
func (in *inbox) bufOf(b krcore.Local) *krcore.Local {
	if len(in.slab) == 0 {
		in.newSlab()
	}
	p := &in.slab[0]
	*p, in.slab = b, in.slab[1:]
	return p
}

// newSlab gives bufOf a new slab: apart, so that the allocation's code is
// not among the lines every message runs.
//
//go:noinline
func (in *inbox) newSlab() { in.slab = make([]krcore.Local, slabLen) }

// deliverTo places message m, whose payload is data, in the oldest posted
// buffer, or keeps a copy; it reports false when it drops it (the queue
// closed, its inbox full). A WRITE_WITH_IMM's notification has no payload
// and takes no buffer: it joins the received messages in its order. For
// the queue's own PopMsgs polling the receive queue (msgs not nil), a
// message that finds none ready before it and room in msgs goes there,
// popped as it is delivered, under one lock of q.mu and without a
// wake-up (the one it would wake is its taker).
func (q *Queue) deliverTo(m *krcore.Message, data []byte, msgs *ownMsgs) bool {
	// Unlocked on each return, not deferred: this is every message's path.
	q.mu.Lock()
	in := &q.msgs
	if !m.Write {
		m.Len = len(data)
	}
	switch {
	case q.closed, m.Write && in.ready.Len() >= maxInbox:
		q.mu.Unlock()
		return false
	case m.Write:
	case in.bufs.n > 0:
		buf := in.bufs.pop()
		bm := mrOf(buf)
		n := copy(bm.mem[buf.Off:buf.Off+buf.Len], data) // the buffer holds bm (inbox.hold)
		if bm != in.hold {
			bm.unuse() // after the copy: the memory stays until then
		}
		if n < len(data) {
			m.Status, m.Len = verbs.LocLenErr, n
		}
		m.Buf = in.bufOf(buf)
	case in.ready.Len() < maxInbox:
		m.Data = copyData(data)
	default:
		q.mu.Unlock()
		return false
	}
	if msgs != nil && in.ready.Len() == 0 && msgs.n < len(msgs.out) {
		msgs.out[msgs.n] = *m
		msgs.n++
	} else {
		q.keep(m)
	}
	q.mu.Unlock()
	return true
}

// keep queues the delivered message m for PopMsgs and wakes its waiters:
// deliverTo's path for a message no poll of the queue's own takes, apart
// so that its code is not among the lines that poll's messages run; q.mu
// held.
//
//go:noinline
func (q *Queue) keep(m *krcore.Message) {
	q.msgs.ready.Push(*m)
	q.nready.Add(1) // an atomic no later load passes, before kick reads waiters
	q.rt.kick(q)
}

// copyData is a copy of a message that arrived before a buffer was posted
// for it (nil for an empty one), made apart from deliverTo's common path.
//
//go:noinline
func copyData(data []byte) []byte { return append([]byte(nil), data...) }

// Bind makes the queue receive the messages sent to port on this node.
// Port 0 is the runtime's own.
func (q *Queue) Bind(port uint32) error {
	if port == 0 || port&portHasImm != 0 {
		return fmt.Errorf("core: bind port %d: reserved: %w", port, verbs.ErrInvalid)
	}
	return q.rt.bind(q, port)
}

// bind checks q is open and takes the port under rt.mu, as Unbind gives
// it back: a Close that began before bind is seen here, and one that
// begins after unbinds what bind took, so no closed queue keeps a port.
func (rt *Runtime) bind(q *Queue, port uint32) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed || q.isClosed() {
		return fmt.Errorf("core: bind port %d: %w", port, krcore.ErrClosed)
	}
	if _, taken := rt.ports[port]; taken {
		return fmt.Errorf("core: bind port %d: %w", port, krcore.ErrPortInUse)
	}
	if !q.port.CompareAndSwap(0, port) {
		return fmt.Errorf("core: queue already bound to port %d: %w", q.port.Load(), krcore.ErrPortInUse)
	}
	rt.ports[port] = q
	rt.publishPorts()
	return nil
}

// publishPorts replaces the receive path's copy of the port table;
// rt.mu held.
func (rt *Runtime) publishPorts() {
	view := maps.Clone(rt.ports)
	rt.portView.Store(&view)
}

// Unbind stops the queue receiving; messages already received stay.
func (q *Queue) Unbind() {
	q.rt.mu.Lock()
	defer q.rt.mu.Unlock()
	port := q.port.Swap(0)
	if port != 0 && q.rt.ports[port] == q {
		delete(q.rt.ports, port)
		q.rt.publishPorts()
	}
}

// PushRecv posts buffers that messages to the bound port land in, in order.
func (q *Queue) PushRecv(bufs ...krcore.Local) error {
	// Unlocked on each return, not deferred: a buffer is posted back for
	// every message. The refusals are built apart (refuseRecv), so that
	// the code every message runs stays in few cache lines.
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return errRecvClosed
	}
	in := &q.msgs
	// Each buffer checked and held in one pass; a refusal drops the
	// holds taken, so that none of bufs is posted.
	for i := range bufs {
		b := &bufs[i]
		m := q.rt.ownMR(b.MR)
		if m == nil || !m.live() || b.Len == 0 || !b.Fits(m.Len()) || m.access&verbs.AccessLocalWrite == 0 {
			return q.refuseRecv(bufs, i, false)
		}
		if m != in.hold && !m.use() {
			return q.refuseRecv(bufs, i, true)
		}
	}
	if in.hold == nil && in.bufs.n == 0 && len(bufs) > 0 {
		in.takeHold(bufs)
	}
	for i := range bufs {
		if in.bufs.full() {
			in.bufs.grow()
		}
		in.bufs.put(bufs[i])
	}
	q.mu.Unlock()
	return nil
}

var errRecvClosed = fmt.Errorf("core: push receive: %w", krcore.ErrClosed)

// refuseRecv refuses PushRecv's bufs for bufs[i] (dead: its MR was
// deregistered since the check), dropping the uses the buffers before it
// took, and releases q.mu.
//
//go:noinline
func (q *Queue) refuseRecv(bufs []krcore.Local, i int, dead bool) error {
	q.msgs.unuseAll(bufs[:i])
	q.mu.Unlock()
	if dead {
		return fmt.Errorf("core: push receive buffer %d: MR deregistered: %w", i, verbs.ErrInvalid)
	}
	return fmt.Errorf("core: push receive buffer %d: not inside a live MR of this runtime with LOCAL_WRITE: %w", i, verbs.ErrInvalid)
}

// takeHold makes the MR of bufs[0] the inbox's hold (see inbox.hold):
// bufs, accepted with a use each, are about to be posted where none is,
// and the first buffer's use becomes the hold, the others' in the same MR
// dropped; q.mu held.
func (in *inbox) takeHold(bufs []krcore.Local) {
	m := mrOf(bufs[0])
	in.hold = m
	for _, b := range bufs[1:] {
		if mrOf(b) == m {
			m.unuse() // never the last: the hold stays
		}
	}
}

// unuseAll drops the uses PushRecv took on bufs' MRs.
func (in *inbox) unuseAll(bufs []krcore.Local) {
	for _, u := range bufs {
		if m := mrOf(u); m != in.hold {
			m.unuse()
		}
	}
}

// dropBufs forgets the posted receive buffers in m (every one if m is nil)
// and their holds on their MRs, the inbox's hold of m included; q.mu held.
func (q *Queue) dropBufs(m *MR) {
	in := &q.msgs
	r := &in.bufs
	kept := 0
	for i := range r.n {
		b := r.at(i)
		if m == nil || mrOf(b) == m {
			if bm := mrOf(b); bm != in.hold {
				bm.unuse()
			}
			continue
		}
		*r.slot(kept) = b // kept <= i: no buffer not yet looked at is overwritten
		kept++
	}
	for i := kept; i < r.n; i++ {
		*r.slot(i) = krcore.Local{} // they hold no MR once gone
	}
	r.n = kept
	if h := in.hold; h != nil && (m == nil || h == m) {
		in.hold = nil
		h.unuse()
	}
}

// dropUses drops every queue's uses of m, which is being deregistered:
// its posted receive buffers in m (messages never land in it again) and
// its hold of m if no request relies on it (see Queue.hold).
func (rt *Runtime) dropUses(m *MR) {
	rt.mu.RLock()
	qs := make([]*Queue, 0, len(rt.queues))
	for _, q := range rt.queues {
		qs = append(qs, q)
	}
	rt.mu.RUnlock()
	for _, q := range qs {
		q.mu.Lock()
		q.dropBufs(m)
		q.dropIdleHold(m)
		if q.last.m == m {
			q.last = plainKey{} // refused anyway (quick checks live), but not kept
		}
		q.mu.Unlock()
	}
}

// PopMsgs moves received messages into out and returns how many. It never
// blocks.
func (q *Queue) PopMsgs(out []krcore.Message) int {
	if n := q.popMsgs(out); n > 0 {
		return n
	}
	// What the poll finds for q while none is ready comes straight here;
	// anything behind those (out full) is in the inbox for the next call.
	own := ownMsgs{out: out}
	q.rt.recvs.pollFor(q, nil, &own)
	if own.n > 0 {
		return own.n
	}
	return q.popMsgs(out)
}

// popMsgs pops what messages are ready. A look at none takes no lock: a
// caller spinning on an empty port would otherwise take q.mu on every
// look, a line the delivering goroutine on another core writes.
func (q *Queue) popMsgs(out []krcore.Message) int {
	if q.nready.Load() == 0 {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.msgs.ready.Items())
	q.msgs.ready.Drop(n)
	q.nready.Add(-int32(n))
	return n
}

// PopMsgsWait is PopMsgs that waits for at least one message. An empty
// out could never take one: it is refused at once (verbs.ErrInvalid).
func (q *Queue) PopMsgsWait(ctx context.Context, out []krcore.Message) (int, error) {
	if len(out) == 0 {
		return 0, fmt.Errorf("core: pop messages wait: no room for a message: %w", verbs.ErrInvalid)
	}
	var n int
	err := q.rt.recvs.wait(ctx, q, func() bool {
		n = q.popMsgs(out)
		return n > 0
	}, nil)
	return n, err
}

// PopAnyWait waits for at least one completion (into out) or message
// (into msgs) and pops what is ready of both. With completions wanted it
// waits as PopWait does, on the node's send completion queue, and polls
// the receive queue beside it: a message to the port wakes it through
// whoever dispatches the receive queue (kick). With out empty it is
// PopMsgsWait. Both empty is refused at once (verbs.ErrInvalid).
func (q *Queue) PopAnyWait(ctx context.Context, out []krcore.Completion, msgs []krcore.Message) (nc, nm int, err error) {
	switch {
	case len(out) == 0 && len(msgs) == 0:
		return 0, 0, fmt.Errorf("core: pop any wait: no room for a completion or a message: %w", verbs.ErrInvalid)
	case len(out) == 0:
		nm, err = q.PopMsgsWait(ctx, msgs)
		return 0, nm, err
	}
	err = q.rt.sends.wait(ctx, q, func() bool {
		nc = q.popReady(out)
		if len(msgs) > 0 {
			if nm = q.popMsgs(msgs); nm == 0 && q.rt.recvs.poll() > 0 {
				nm = q.popMsgs(msgs)
			}
		}
		return nc+nm > 0
	}, nil)
	return nc, nm, err
}
