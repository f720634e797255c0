package smc

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
)

// Who pops a Node's port.
//
// The port's notifications and CDC messages reach a connection through
// whoever pops the port. When that is the Node's serving goroutine, a
// message for a reader is handed from it to the reader, and the
// goroutine that read the message off the link (krcore's waiter on its
// receive queue, which on the soft RNIC reads the shared-memory link
// itself) is often a third: each hand-off a wake-up, on a loaded machine
// of two cores tens of microseconds, against a few for the message
// itself (MEASUREMENTS.md, session 18). So popping is a role that moves:
// a reader (or a writer waiting for window) with nothing to read takes
// it when nobody pops and waits in the port's PopMsgsWait itself,
// dispatching whatever comes, its own message included, with no
// hand-off; the serving goroutine pops while the role is free of
// readers. A waiter that finds the role taken waits for its signal as
// before.
//
// A reader that has its bytes keeps the role lent while its application
// works: a ping-pong's next wait takes it back without waking anyone.
// Meanwhile nobody pops, so the serving goroutine takes a role lent (or
// left free) for lendFor back, and at once when a reader waits for its
// signal behind a popping reader that leaves.
type popRole struct {
	mu      sync.Mutex
	by      int       // popFree, popServe, popReader or popLent
	since   time.Time // when a reader lent the role, or the serving goroutine left it
	waiting int       // goroutines waiting for a signal while a reader pops
	wake    chan struct{}
	msgs    [64]krcore.Message // the holder's
}

// States of popRole.by.
const (
	popFree   = iota // nobody pops; the serving goroutine takes it back after lendFor
	popServe         // the serving goroutine pops
	popReader        // a connection's waiter pops
	popLent          // a reader that popped is back in its application
)

// lendFor is how long the role may stay lent or free before the serving
// goroutine takes it back: it bounds how late a message for a connection
// that nobody waits on (a close flag for the keeper) is dispatched.
const lendFor = time.Millisecond

// takeForWait gives the role to a waiter of a connection if nobody pops,
// or counts it among those waiting for a signal; it reports which.
func (r *popRole) takeForWait() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.by {
	case popFree, popLent:
		r.by = popReader
		return true
	}
	r.waiting++
	return false
}

// doneWaiting undoes takeForWait's count.
func (r *popRole) doneWaiting() {
	r.mu.Lock()
	r.waiting--
	r.mu.Unlock()
}

// lend is a popping reader leaving: the role stays lent to it unless
// others wait for a signal, who then need the serving goroutine to pop.
func (r *popRole) lend() {
	r.mu.Lock()
	r.by, r.since = popLent, time.Now()
	free := r.waiting > 0
	if free {
		r.by = popFree
	}
	r.mu.Unlock()
	if free {
		signal(r.wake)
	}
}

// takeForServe gives the role to the serving goroutine if it is free or
// lent for lendFor, or others wait for a signal; otherwise it reports
// how long to wait before asking again.
func (r *popRole) takeForServe() (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.by {
	case popServe:
		return true, 0
	case popReader:
		return false, lendFor
	}
	if left := lendFor - time.Since(r.since); left > 0 && r.waiting == 0 {
		return false, left
	}
	r.by = popServe
	return true, 0
}

// leaveServe is the serving goroutine done with a batch: it keeps popping
// while goroutines wait for its signals, and otherwise leaves the role
// free for a reader to take.
func (r *popRole) leaveServe() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting > 0 {
		return false
	}
	r.by, r.since = popFree, time.Now()
	return true
}

// serve dispatches the port's notifications and messages to connections
// by token until the Node closes, while the port's role is its own.
func (n *Node) serve(ctx context.Context) {
	defer close(n.done)
	r := &n.pop
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
			if ctx.Err() == nil { // not Close: the runtime failed (krcored gone)
				n.abortAll(err)
			}
			return
		}
		n.dispatchAll(r.msgs[:k])
		r.leaveServe()
		// The readers just woken wait in this goroutine's run queue: let
		// them run first. Its next wait may block its thread in a system
		// call (the soft RNIC's shared-memory link sleeps on a futex),
		// and they would wait until the Go runtime takes the queue back:
		// 13-46 us a message, measured cross-process on two cores.
		runtime.Gosched()
	}
}

// dispatchAll dispatches msgs and clears them; the role held.
func (n *Node) dispatchAll(msgs []krcore.Message) {
	for i := range msgs {
		n.dispatch(&msgs[i])
		msgs[i] = krcore.Message{}
	}
}

// await waits until sig is signalled, dl or done closes, or the port
// brings something: as the port's popper when nobody pops (see popRole),
// else for sig. The caller looks at its state again either way.
func (c *Conn) await(sig, dl <-chan struct{}) {
	r := &c.node.pop
	if !r.takeForWait() {
		select {
		case <-sig:
		case <-dl:
		case <-c.done:
		}
		r.doneWaiting()
		return
	}
	// Published before the last look at sig: whoever signals sig after
	// it cancels the wait (wake), and a signal before it is seen here.
	c.popping.Add(1)
	ctx := c.waitCtx()
	var k int
	var err error
	select {
	case <-sig:
	case <-dl:
	case <-c.done:
	default:
		k, err = c.node.srv.PopMsgsWait(ctx, r.msgs[:])
		c.node.dispatchAll(r.msgs[:k])
	}
	c.popping.Add(-1)
	if err == nil || ctx.Err() != nil {
		r.lend()
		return
	}
	// The port failed: the serving goroutine finds why (abortAll) and
	// tells the connections; this waiter waits for that.
	r.mu.Lock()
	r.by, r.since = popFree, time.Time{}
	r.mu.Unlock()
	signal(r.wake)
	select {
	case <-sig:
	case <-dl:
	case <-c.done:
	}
}

// waitCtx is the context a popping waiter of c waits within: cancelled by
// wake (a signal, a deadline, Close) or the Node's close.
func (c *Conn) waitCtx() context.Context {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wctx == nil {
		c.wctx, c.wcancel = context.WithCancel(c.node.ctx)
	}
	return c.wctx
}

// wake signals ch (rxSig or txSig) from outside the port's dispatch, and
// ends the wait of a waiter of c popping the port, which does not watch
// the channels while it waits there.
func (c *Conn) wake(ch chan struct{}) {
	signal(ch)
	c.interrupt()
}

// interrupt ends the wait of a waiter of c popping the port.
func (c *Conn) interrupt() {
	if c.popping.Load() == 0 {
		return
	}
	c.wmu.Lock()
	if c.wcancel != nil {
		c.wcancel()
		c.wctx, c.wcancel = nil, nil
	}
	c.wmu.Unlock()
}

// popWait is the part of a Conn that await uses.
type popWait struct {
	popping atomic.Int32 // waiters of the connection in the port's PopMsgsWait
	wmu     sync.Mutex
	wctx    context.Context
	wcancel context.CancelFunc
}
