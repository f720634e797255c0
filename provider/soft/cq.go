package soft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/verbs"
)

// cqe is a completion plus what Poll needs to free send queue slots.
type cqe struct {
	wc    verbs.WC
	q     *qp    // the send QP, nil for receive completions
	sqIdx uint64 // the send queue index the completion retires
}

// cq is a completion queue: a fixed ring, like hardware's, that overruns
// instead of growing.
type cq struct {
	node   *Node
	ring   []cqe
	ready  atomic.Int32  // entries in the ring, read without the lock by Poll
	flags  atomic.Uint32 // cqOverrun, cqClosed: read without the lock
	users  atomic.Int32  // QPs using the CQ
	idle   atomic.Uint32 // empty polls since the last Wait
	idleAt atomic.Int64  // node.now() at the idlePolls-th of them

	// link is the TCP link the CQ's QPs last used: a waiter reads it
	// itself (see read.go). rlink is the link a waiter of this CQ is
	// reading; rblocked is set while that waiter may block for a frame.
	link  atomic.Pointer[tcpLink]
	multi atomic.Bool // the CQ's QPs have used links to several peers
	// shm is the shared-memory link the CQ's QPs last used: a waiter
	// reads it itself (see shmrole.go).
	shm atomic.Pointer[shmLink]
	// shmSleeper is the link a waiter of c holding its read role sleeps
	// on: wake interrupts it.
	shmSleeper atomic.Pointer[shmLink]
	shmSlow    atomic.Bool // the last wait on it outlasted a spin
	shmLearn   spinLearner // whether its waits' answers come within a spin
	rlink      atomic.Pointer[tcpLink]
	rblocked   atomic.Bool
	unyield    atomic.Bool     // a waiter that gave up a link may take it back
	rctx       context.Context // that waiter's context; it owns the field
	readStop   func() bool     // c.stopReading, made once

	mu      sync.Mutex
	head    int
	n       int
	waiters int
	bell    chan struct{} // a token for one Wait caller; it passes it on
	actx    context.Context
	astop   func() bool // stops the interrupt registered on actx
}

// CQ flags.
const (
	cqOverrun = 1 << iota
	cqClosed
)

// A goroutine that keeps polling a CQ without waiting reads the CQ's
// link itself, if lent, without waiting for data, every pollRead empty
// polls (a busy poller, or a waiter spinning before it sleeps, then needs
// no other goroutine to bring its completions). A CQ whose completions may
// come on any link instead hands every lent link back to its reader once
// it has been polled for idleHandBack (looked at every idlePolls).
const (
	pollRead     = 16
	idlePolls    = 64
	idleHandBack = 50 * time.Microsecond
)

// CreateCQ creates a completion queue of cqe entries.
func (n *Node) CreateCQ(entries int) (verbs.CQ, error) {
	if entries <= 0 || entries > n.attr.MaxCQE {
		return nil, fmt.Errorf("soft: CQ of %d entries (max %d): %w", entries, n.attr.MaxCQE, verbs.ErrInvalid)
	}
	if err := n.reserve(&n.counts.cq, n.attr.MaxCQ, "CQ"); err != nil {
		return nil, err
	}
	c := &cq{node: n, ring: make([]cqe, entries), bell: make(chan struct{}, 1)}
	c.readStop = c.stopReading
	if err := track(n, n.cqs, c); err != nil {
		n.release(&n.counts.cq)
		return nil, err
	}
	return c, nil
}

func (c *cq) Cap() int { return len(c.ring) }

// push adds a completion. It reports false when the CQ is full: the entry
// is lost and the CQ is overrun, as on hardware.
func (c *cq) push(e cqe) bool {
	c.mu.Lock()
	if c.flags.Load() != 0 {
		c.mu.Unlock()
		return false
	}
	if c.n == len(c.ring) {
		c.flags.Or(cqOverrun)
		c.wake()
		c.mu.Unlock()
		return false
	}
	c.ring[(c.head+c.n)%len(c.ring)] = e
	c.n++
	c.ready.Store(int32(c.n))
	c.wake()
	c.mu.Unlock()
	return true
}

// wake hands a Wait caller the token and interrupts a waiter blocked
// reading a link; c.mu is held.
func (c *cq) wake() {
	if c.waiters > 0 {
		c.ringBell()
	}
	c.interruptShm()
	if c.rblocked.Load() {
		if l := c.rlink.Load(); l != nil {
			l.interrupt()
		}
	}
}

// interruptShm wakes a waiter of c sleeping on a shared-memory link.
func (c *cq) interruptShm() {
	if l := c.shmSleeper.Load(); l != nil {
		l.wakeSelf()
	}
}

// ringBell puts the token in the bell.
func (c *cq) ringBell() {
	select {
	case c.bell <- struct{}{}:
	default:
	}
}

// setLink notes the TCP link the CQ's QPs use now.
func (c *cq) setLink(l *tcpLink) {
	if old := c.link.Load(); old != l {
		if old != nil && old.addr != l.addr {
			c.multi.Store(true)
		}
		c.link.Store(l)
	}
}

// setShm notes the shared-memory link the CQ's QPs use now.
func (c *cq) setShm(l *shmLink) {
	if old := c.shm.Load(); old != l {
		if old != nil && old.addr != l.addr {
			c.multi.Store(true)
		}
		c.shm.Store(l)
	}
}

// ProgressesAlone reports whether the CQ's completions arrive without a
// goroutine waiting in Wait: none of its QPs has used a TCP or
// shared-memory link (whose frames a waiter reads), so every completion so
// far came from the in-memory wire, where a request is carried out in its
// poster's goroutine. core's runtime asks it before its receive waiter
// leaves the CQ to the application goroutines polling it.
func (c *cq) ProgressesAlone() bool { return c.link.Load() == nil && c.shm.Load() == nil }

// Quiet reports that a Poll now would return nothing and do nothing: no
// completion is ready, none of the CQ's QPs has used a link a poller reads
// (ProgressesAlone), no link is lent to pollers (idlePoll) and the CQ has
// not failed (stopped). core's runtime asks it before it takes the lock
// its polls of a shared CQ hold, so that a goroutine spinning on an empty
// CQ in one process runs loads only, as a raw QP's poller does.
func (c *cq) Quiet() bool {
	return c.ready.Load() == 0 && c.ProgressesAlone() && c.node.lent.Load() == 0 && !c.stopped()
}

// shmOnly returns the shared-memory link all of c's completions come on,
// or nil if they may come on other links too.
func (c *cq) shmOnly() *shmLink {
	l := c.shm.Load()
	if l == nil || c.multi.Load() || c.link.Load() != nil {
		return nil
	}
	return l
}

// shmToRead returns the shared-memory link a waiter of c reads: the one
// c's QPs used last, unless c has a TCP link. Completions may come on
// other links too when c's QPs talk to several peers; those links'
// background readers push them, which wakes the waiter reading this one
// (interruptShm), so the waiter first gives every other lent link back to
// its reader (activateLentShm). Parking instead, as a waiter with no link
// to read does, costs every completion a hand-off from a background
// reader to the parked goroutine: the master of krbench lite, whose
// runtime talks to the mapper's and krcored's nodes, had 253 thousand of
// its 255 thousand frames read by background readers.
func (c *cq) shmToRead() *shmLink {
	l := c.shm.Load()
	if l == nil || c.link.Load() != nil {
		return nil
	}
	if c.multi.Load() {
		c.node.activateLentShm(l)
	}
	return l
}

// activateLentShm gives every lent shared-memory link but keep back to its
// background reader.
func (n *Node) activateLentShm(keep *shmLink) {
	n.linkMu.Lock()
	for _, l := range n.shm {
		if l != keep && l.role.Load() == shmRoleLent && l.role.CompareAndSwap(shmRoleLent, shmRoleBackground) {
			l.kickReader()
		}
	}
	n.linkMu.Unlock()
}

// idlePoll counts an empty poll while some link is lent.
func (c *cq) idlePoll() {
	k := c.idle.Add(1)
	if l := c.link.Load(); l != nil && !c.multi.Load() {
		if k%pollRead == 0 {
			c.pollLink(l)
		}
		return
	}
	if k%idlePolls != 0 {
		return
	}
	now := c.node.now()
	if k == idlePolls {
		c.idleAt.Store(now)
	} else if time.Duration(now-c.idleAt.Load()) >= idleHandBack {
		c.node.activateLent()
	}
}

// pollLink reads l for a poller of c, if l is lent, without waiting.
func (c *cq) pollLink(l *tcpLink) {
	if !l.take() {
		return
	}
	if !c.rlink.CompareAndSwap(nil, l) {
		l.release(nil)
		return
	}
	err := l.rd.poll()
	c.rlink.Store(nil)
	l.flushAcks()
	if err != nil {
		l.kill()
		return
	}
	l.keep() // a poller comes back: do not wake those it would displace
}

var errCQOverrun = fmt.Errorf("soft: CQ overrun, completions were lost: %w", verbs.ErrCQOverrun)

func (c *cq) Poll(wc []verbs.WC) (int, error) {
	if c.ready.Load() == 0 {
		if l := c.shmOnly(); l != nil {
			c.pollShm(l)
		}
	}
	if c.ready.Load() == 0 {
		if c.node.lent.Load() > 0 {
			c.idlePoll()
		}
		return 0, c.idleErr()
	}
	var retire [16]cqe
	c.mu.Lock()
	k := min(len(wc), c.n)
	nr := 0
	for i := 0; i < k; i++ {
		e := &c.ring[c.head]
		wc[i] = e.wc
		if e.q != nil {
			// Only the newest retirement per QP matters; keep a few.
			if nr > 0 && retire[nr-1].q == e.q {
				retire[nr-1].sqIdx = e.sqIdx
			} else if nr < len(retire) {
				retire[nr] = cqe{q: e.q, sqIdx: e.sqIdx}
				nr++
			} else {
				e.q.retire(e.sqIdx)
			}
		}
		*e = cqe{}
		c.head = (c.head + 1) % len(c.ring)
	}
	c.n -= k
	if c.n == 0 {
		// The next completion takes slot 0: a CQ drained as it fills
		// (a poller waiting for each) reuses its first lines instead of
		// walking a ring that may be thousands of entries long (a
		// runtime's shared CQs), each entry a line the cache lost.
		c.head = 0
	}
	c.ready.Store(int32(c.n))
	c.mu.Unlock()
	for _, r := range retire[:nr] {
		r.q.retire(r.sqIdx)
	}
	return k, nil
}

// idleErr is Poll's answer when nothing is queued; it takes no lock.
func (c *cq) idleErr() error {
	f := c.flags.Load()
	switch {
	case f&cqOverrun != 0:
		return errCQOverrun
	case f&cqClosed != 0:
		return errCQClosed
	case c.node.closed.Load():
		return errNodeClosed
	}
	return nil
}

var errCQClosed = fmt.Errorf("soft: CQ: %w", verbs.ErrClosed)

// stopped reports whether Wait has nothing to wait for but an error.
func (c *cq) stopped() bool { return c.flags.Load() != 0 || c.node.closed.Load() }

func (c *cq) Wait(ctx context.Context) error {
	if c.idle.Load() != 0 {
		c.idle.Store(0)
	}
	// yielded: this call read a link and gave it up to a goroutine that
	// asked for it; it sleeps without asking back until rung (unyield)
	// when the link is released with nobody asking for it.
	yielded := false
	if c.unyield.Load() {
		c.unyield.Store(false)
	}
	// spun: this call read the shared-memory link for shmSpin and handed
	// it back; it parks without asking for it again.
	spun := false
	// yieldedTo: this call gave the role of that link up to a waiter that
	// asked; while it waits the link is taken back sooner (awaitRole).
	var yieldedTo *shmLink
	defer func() {
		if yieldedTo != nil {
			yieldedTo.yielders.Add(-1)
		}
	}()
	for {
		if c.ready.Load() > 0 {
			return nil
		}
		if c.stopped() {
			return c.idleErr()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if l := c.shmToRead(); l != nil && !spun {
			switch l.claim(c) {
			case claimTaken:
				got, yielded := c.readShm(ctx, l)
				spun = !got
				if yielded && yieldedTo == nil {
					yieldedTo = l
					l.addYielder()
				}
				continue
			case claimAsked:
				c.park(ctx, l, false)
				continue
			}
		}
		var asked roleAsker
		blind := true // what c waits for may come on any link
		if l := c.link.Load(); l != nil {
			if yielded || c.rlink.Load() != nil {
				blind = c.multi.Load() // someone else reads l
			} else {
				switch l.claim(c) {
				case claimTaken:
					yielded = c.readLink(ctx, l)
					continue
				case claimAsked:
					asked, blind = l, c.multi.Load()
				}
			}
		}
		c.park(ctx, asked, blind)
		if yielded && c.unyield.Swap(false) {
			yielded = false // the link is free again: take it back
		}
	}
}

// readLink reads l, whose role the caller took, until c has a completion,
// ctx ends or another goroutine asks for the role (it reports true then);
// then the role is released.
func (c *cq) readLink(ctx context.Context, l *tcpLink) (yielded bool) {
	if !c.rlink.CompareAndSwap(nil, l) {
		l.release(nil) // another waiter of c reads; it will ring us
		c.park(ctx, nil, c.multi.Load())
		return false
	}
	if n := c.node; c.multi.Load() && n.lent.Load() > 0 {
		n.activateLent() // what c waits for may come on another link
	}
	c.watch(ctx)
	c.rctx = ctx
	ok := c.readFor(l)
	c.rctx = nil
	c.rlink.Store(nil)
	if !ok {
		l.kill()
		return false
	}
	switch {
	case c.ready.Load() > 0:
		// ACKs of the SENDs that just completed here stay coalesced:
		// the application is about to answer (its reply carries them,
		// in one write instead of two, and the peer wakes once) or to
		// wait again, whose read flushes them before it blocks. If it
		// does neither, whoever reads the link next flushes them: a
		// poller now and then (pollLink), the background reader within
		// lendTimeout.
		l.keep()
	case l.nwant.Load() > 0:
		l.flushAcks()
		l.release(c)
		return true
	default:
		l.flushAcks()
		l.release(nil)
	}
	return false
}

// watch makes ctx's end interrupt a waiter of c blocked reading a link.
// The registration is kept for the next wait with the same context.
func (c *cq) watch(ctx context.Context) {
	if ctx.Done() == nil {
		return
	}
	c.mu.Lock()
	if c.actx != ctx {
		if c.astop != nil {
			c.astop()
		}
		c.actx = ctx
		c.astop = context.AfterFunc(ctx, c.interruptReader)
	}
	c.mu.Unlock()
}

// interruptReader interrupts the waiter of c blocked reading a link, if any:
// a context ended.
func (c *cq) interruptReader() {
	c.interruptShm()
	if c.rblocked.Load() {
		if l := c.rlink.Load(); l != nil {
			l.interrupt()
		}
	}
}

// roleAsker is a link whose read role a waiter may ask for.
type roleAsker interface{ unwant(c *cq) }

// park waits for the bell (or ctx); asked is a link whose role the caller
// asked for. A blind waiter, which cannot tell which link its completions
// come on, first gives every lent link back to its reader: nobody else may
// be reading what it waits for.
func (c *cq) park(ctx context.Context, asked roleAsker, blind bool) {
	n := c.node
	c.mu.Lock()
	if c.n > 0 || c.stopped() {
		c.mu.Unlock()
		if asked != nil {
			asked.unwant(c)
		}
		return
	}
	c.waiters++
	c.mu.Unlock()
	if blind && n.lent.Load() > 0 {
		n.activateLent()
	}
	select {
	case <-c.bell:
	case <-ctx.Done():
	}
	if asked != nil {
		asked.unwant(c)
	}
	c.mu.Lock()
	c.waiters--
	if c.n > 0 || c.stopped() {
		c.wake() // pass the token to the next waiter
	}
	c.mu.Unlock()
}

func (c *cq) Close() error {
	if u := c.users.Load(); u > 0 {
		return fmt.Errorf("soft: destroy CQ used by %d QPs: %w", u, verbs.ErrBusy)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flags.Load()&cqClosed != 0 {
		return errCQClosed
	}
	c.flags.Or(cqClosed)
	c.wake()
	if c.astop != nil {
		c.astop()
		c.actx, c.astop = nil, nil
	}
	c.node.release(&c.node.counts.cq)
	untrack(c.node, c.node.cqs, c)
	return nil
}

// wakeAll wakes every waiter, for a closing node.
func (c *cq) wakeAll() {
	c.mu.Lock()
	c.wake()
	c.mu.Unlock()
}
