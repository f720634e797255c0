package smc

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/poprole"
)

// Who pops a Node's port.
//
// The port's notifications and CDC messages reach a connection through
// whoever pops the port, a role that moves (internal/poprole): a reader
// (or a writer waiting for window) with nothing to read takes it when
// nobody pops and waits in the port's PopMsgsWait itself, dispatching
// whatever comes, its own message included; the serving goroutine pops
// while the role is free of readers, and leaves it free after each batch.
// A waiter that finds the role taken waits for its signal, counted in the
// role's need (TakeOrWait). The role is patient (poprole.NewPatient): a
// Node has a reader waiting on every connection, most of them idle, so
// the serving goroutine taking the role back whenever one waits kept it
// for good, and each message to a busy reader was a hand-off (a wake-up,
// often of a thread: over the soft TCP link the largest cost left in a
// round trip, MEASUREMENTS.md session 22). Only waiters that began to
// wait within poprole.FreshFor (50 ms) to twice that hurry it. A popper
// whose batch woke other waiters and not itself leaves the role to them
// and waits for its signal, patiently (Need); a message for an idle or
// patient waiter while the role is lent waits for the next waiter to
// take the role, or LendFor at most.
type popRole struct {
	*poprole.Role
	msgs [64]krcore.Message // the holder's
	// woken counts the waiters counted in the role's need that a
	// signal woke (signalSig): a popper's batch that woke one leaves
	// the role to it.
	woken atomic.Uint64
}

// serve dispatches the port's notifications and messages to connections
// by token until the Node closes, while the port's role is its own.
func (n *Node) serve(ctx context.Context) {
	defer close(n.done)
	if err := n.pop.Serve(ctx, n.batch); ctx.Err() == nil { // not Close: the runtime failed (krcored gone)
		n.abortAll(err)
	}
}

// batch pops the port once and dispatches what came: the readers it woke
// take the role next.
func (n *Node) batch(ctx context.Context) (leave bool, err error) {
	r := &n.pop
	k, err := n.srv.PopMsgsWait(ctx, r.msgs[:])
	if err != nil {
		return false, err
	}
	n.dispatchAll(r.msgs[:k])
	return true, nil
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
	if taken, ticket := r.TakeOrWait(); !taken {
		c.waitSig(sig, dl, ticket)
		return
	}
	// Published before the last look at sig: whoever signals sig after
	// it cancels the wait (wake), and a signal before it is seen here.
	c.popping.Add(1)
	ctx := c.waitCtx()
	var k int
	var err error
	woken := r.woken.Load()
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
		r.Lend()
		if err == nil && len(sig) == 0 && r.woken.Load() != woken {
			// What came woke others, not this waiter: leave the role
			// to them, and wait for sig as they did. Taking it back
			// had an idle reader keep it for good, and each of a busy
			// reader's messages be a hand-off.
			r.Need()
			c.waitSig(sig, dl, 0)
		}
		return
	}
	// The port failed: the serving goroutine finds why (abortAll) and
	// tells the connections; this waiter waits for that. (Return, not
	// Fail: the serving goroutine stops at the failure, and never pops
	// well again to clear a failing mark.)
	r.Return()
	select {
	case <-sig:
	case <-dl:
	case <-c.done:
	}
}

// waitSig waits until sig is signalled, dl or done closes, counted in the
// port role's need (TakeOrWait's ticket, or Need's 0) until then.
func (c *Conn) waitSig(sig, dl <-chan struct{}, ticket int64) {
	needs, t := c.needs(sig)
	t.Store(ticket)
	needs.Store(true)
	select {
	case <-sig:
	case <-dl:
	case <-c.done:
	}
	if needs.Swap(false) {
		c.node.pop.Unwait(ticket)
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
	c.signalSig(ch)
	c.interrupt()
}

// signalSig signals ch (rxSig or txSig). A waiter for it counted as needing the
// serving goroutine to pop (await) is uncounted here, before it runs: the
// serving goroutine that signalled it in a batch then leaves the role free
// for it (poprole's leaveServe) instead of keeping the port because the
// waiter it just woke still counts, which had a ping-pong's reader wait
// for its signal at every message, a hand-off each (session 20's records;
// MEASUREMENTS.md, session 21).
func (c *Conn) signalSig(ch chan struct{}) {
	signal(ch)
	if needs, t := c.needs(ch); needs.Load() && needs.Swap(false) {
		c.node.pop.Unwait(t.Load()) // a later wait's ticket, rarely: fresh counts age out
		c.node.pop.woken.Add(1)
	}
}

// needs is the mark of a waiter for sig (rxSig or txSig) counted in the
// port role's need, and its ticket.
func (c *Conn) needs(sig <-chan struct{}) (*atomic.Bool, *atomic.Int64) {
	if sig == c.rxSig {
		return &c.needRx, &c.ticketRx
	}
	return &c.needTx, &c.ticketTx
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
	// needRx, needTx: the reader, the writer, waits for its signal and
	// counts in the role's need; whoever clears the mark uncounts it.
	needRx, needTx     atomic.Bool
	ticketRx, ticketTx atomic.Int64 // their TakeOrWait tickets
	wmu                sync.Mutex
	wctx               context.Context
	wcancel            context.CancelFunc
}
