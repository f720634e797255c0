package lite

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/krcore/krcore"
)

// Who pops the Node's port.
//
// Requests into the rings here (and control messages) reach a service
// through whoever pops the Node's port. When that is the serving goroutine,
// a call is handed from it to the service's Recv, and the goroutine that
// read the notification off the link (krcore's waiter on its receive
// queue, which on the soft RNIC reads the shared-memory link itself) is
// often a third: each hand-off a wake-up, on a loaded machine of two cores
// tens of microseconds against a few for the call itself (MEASUREMENTS.md,
// LITE, session 18). So popping is a role that moves, as smc's (smc/pop.go):
// a Recv (of a Service or an Endpoint) with nothing queued takes it when
// nobody pops and waits in the port's PopMsgsWait itself, handling whatever
// comes, its own call included, with no hand-off.
//
// A Recv that got its own call keeps the role lent while its service works:
// a server's next Recv takes it back without waking anyone. One that
// handed a call to another queue's waiter leaves the role free for that
// waiter's next Recv, and waits for a call of its own. Nobody pops a role
// lent or left free, so the serving goroutine takes it back after lendFor,
// at once when a control request of this Node waits for its reply (the
// requester may be the service that lent the role) or a popping Recv left
// without a call (its context ended, its queue closed). The serving
// goroutine leaves the role free after a batch that handed a call on: the
// Recv that takes it pops next.
type popRole struct {
	mu     sync.Mutex
	by     int       // popServe, popRecv, popFree or popDead
	since  time.Time // when the role was left free: zero is at once for the serving goroutine
	urgent int       // control requests of this Node waiting for their replies
	// failing: a popping Recv's wait failed (the port, not its context):
	// the serving goroutine, which stops on such a failure, pops next.
	failing bool
	wake    chan struct{} // the serving goroutine's: the role may be its now
	left    chan struct{} // a popping Recv left: stopServe waits for it

	// The holder's: msgs its batch; claim the popping Recv's queue, whose
	// first call in a batch is queued unsignalled (claimed then true), for
	// the popper to take; handedOff the batch queued a call for another
	// Recv.
	msgs      [slots]krcore.Message
	claim     *callQueue
	claimed   bool
	handedOff bool
}

// States of popRole.by.
const (
	popServe = iota // the serving goroutine pops
	popRecv         // a Recv pops
	popFree         // nobody pops: a Recv takes it, the serving goroutine after lendFor
	popDead         // the serving goroutine stopped: nobody pops
)

// lendFor is how long the role may stay free before the serving goroutine
// takes it back: it bounds how late a message nobody's Recv pops (a control
// request from another node, a call for a service whose servers are busy)
// is handled.
const lendFor = time.Millisecond

func newPopRole() popRole {
	return popRole{by: popServe, wake: make(chan struct{}, 1), left: make(chan struct{}, 1)}
}

// takeForRecv gives the role to a Recv if it is free.
func (r *popRole) takeForRecv() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by != popFree || r.failing {
		return false
	}
	r.by = popRecv
	return true
}

// leaveRecv is a popping Recv leaving: lent (since now) when it got a call
// of its own or handed one on, for the serving goroutine at once
// otherwise, or when a control request waits for its reply (it came while
// the Recv popped, and awaitReply did not wake the serving goroutine).
func (r *popRole) leaveRecv(lent, failed bool) {
	r.mu.Lock()
	r.by = popFree
	r.since = time.Time{}
	if lent {
		r.since = time.Now()
	}
	r.failing = r.failing || failed
	wake := !lent || r.urgent > 0
	r.mu.Unlock()
	signal(r.left)
	if wake {
		signal(r.wake)
	}
}

// takeForServe gives the role to the serving goroutine if it is its own,
// or free for lendFor, or free and urgent; otherwise it reports how long
// to wait before asking again.
func (r *popRole) takeForServe() (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.by {
	case popServe:
		return true, 0
	case popRecv:
		return false, lendFor
	}
	if left := lendFor - time.Since(r.since); left > 0 && r.urgent == 0 && !r.failing {
		return false, left
	}
	r.by = popServe
	return true, 0
}

// leaveServe is the serving goroutine done with a batch: it leaves the
// role free for the Recv it handed a call to, unless a control request
// waits for its reply.
func (r *popRole) leaveServe() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = false // the port popped well
	if r.handedOff && r.urgent == 0 {
		r.by, r.since = popFree, time.Now()
	}
}

// stopServe is the serving goroutine stopping: nobody pops again. It
// waits for a popping Recv to leave (Close wakes it), so that Close, which
// waits for the serving goroutine, frees the buffers the Recv's messages
// are in (the inbox) only after the Recv has handled them.
func (r *popRole) stopServe() {
	for {
		r.mu.Lock()
		if r.by != popRecv {
			r.by = popDead
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		<-r.left
	}
}

// awaitReply counts a control request waiting for its reply, which
// somebody must pop: the serving goroutine takes a role left free at once.
// The caller calls the returned func when the wait ends.
func (r *popRole) awaitReply() func() {
	r.mu.Lock()
	r.urgent++
	free := r.by == popFree
	r.mu.Unlock()
	if free {
		signal(r.wake)
	}
	return func() {
		r.mu.Lock()
		r.urgent--
		r.mu.Unlock()
	}
}

// signal leaves a token in ch if it has room.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// serve handles the port's messages until ctx is cancelled or srv closes,
// while the port's role is its own.
func (n *Node) serve(ctx context.Context) {
	defer close(n.done)
	r := &n.pop
	defer r.stopServe()
	t := time.NewTimer(lendFor)
	defer t.Stop()
	for {
		ok, wait := r.takeForServe()
		if !ok {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			case <-t.C:
			}
			continue
		}
		k, err := n.srv.PopMsgsWait(ctx, r.msgs[:])
		if err != nil {
			return
		}
		n.handleAll(ctx, r.msgs[:k])
		handed := r.handedOff
		r.leaveServe()
		if handed {
			// A Recv given a call (or message) runs now, here: it
			// spins on its queue with yields, or sleeps woken onto
			// this P, and this goroutine's next wait would poll the
			// completion queue a while before it yields (1.9-2.3 us
			// from the hand-off to Recv returning, 0.4 with this).
			runtime.Gosched()
		}
	}
}

// handleAll handles msgs and clears them; the role held.
func (n *Node) handleAll(ctx context.Context, msgs []krcore.Message) {
	r := &n.pop
	r.handedOff = false
	for i := range msgs {
		n.handle(ctx, &msgs[i])
		msgs[i] = krcore.Message{}
	}
}

// Outcomes of popFor.
const (
	popNone   = iota // the role was not free
	popOwn           // a call for q came (q has it, unless another took it)
	popHanded        // a call went to another Recv: it pops next
	popFailed        // the wait ended (ctx, q closed, the port failed)
)

// popFor pops the Node's port for q's Recv if the role is free, until a
// call comes for q or is handed to another Recv, or ctx ends or q closes.
func (n *Node) popFor(ctx context.Context, q *callQueue) int {
	r := &n.pop
	if !r.takeForRecv() {
		return popNone
	}
	if q.count.Load() > 0 { // queued by the holder before it left the role
		r.leaveRecv(true, false)
		return popOwn
	}
	wctx := q.waitCtx(ctx)
	hctx := n.ops.ctx // the serving goroutine's: what handle's work lives within
	for {
		r.claim, r.claimed = q, false
		k, err := n.srv.PopMsgsWait(wctx, r.msgs[:])
		n.handleAll(hctx, r.msgs[:k])
		own, handed := r.claimed, r.handedOff
		r.claim, r.claimed = nil, false
		switch {
		case own || handed:
			r.leaveRecv(true, false)
			if own {
				return popOwn
			}
			return popHanded
		case err != nil:
			r.leaveRecv(false, wctx.Err() == nil)
			return popFailed
		}
	}
}

// queue pushes c at q (ok false when q is closed, ackNow as push). The
// popping Recv of q takes the first call of its batch itself, so that one
// is queued unsignalled; any other marks the batch as having handed a call
// on. Either mark follows a push that succeeded: a call refused by a
// closing queue neither ends the popping Recv's wait as its own nor leaves
// the role lent for a Recv that has nothing to take. The role held.
func (n *Node) queue(q *callQueue, c *Call) (ok, ackNow bool) {
	r := &n.pop
	own := r.claim == q && !r.claimed
	if ok, ackNow = q.push(c, !own); !ok {
		return false, false
	}
	if own {
		r.claimed = true
	} else {
		r.handedOff = true
	}
	return true, ackNow
}
