package lite

import (
	"context"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/poprole"
)

// Who pops the Node's port.
//
// Requests into the rings here (and control messages) reach a service
// through whoever pops the Node's port, a role that moves
// (internal/poprole): a Recv (of a Service or an Endpoint) with nothing
// queued takes it when nobody pops and waits in the port's PopMsgsWait
// itself, handling whatever comes, its own call included, with no
// hand-off from the serving goroutine.
//
// A Recv that got its own call lends the role while its service works: a
// server's next Recv takes it back without waking anyone. One that handed
// a call to another queue's waiter lends it too, for that waiter's next
// Recv, and waits for a call of its own. One that leaves without a call
// (its context ended, its queue closed) returns the role to the serving
// goroutine at once, and one whose pop failed marks it failing. A control
// request of this Node needs the serving goroutine to pop until its reply
// comes (awaitReply: the requester may be the service that lent the role).
// The serving goroutine leaves the role free after a batch that handed a
// call on: the Recv that takes it pops next.
type popRole struct {
	*poprole.Role

	// The holder's: msgs its batch; claim the popping Recv's queue, whose
	// first call in a batch is queued unsignalled (claimed then true), for
	// the popper to take; handedOff the batch queued a call for another
	// Recv.
	msgs      [slots]krcore.Message
	claim     *callQueue
	claimed   bool
	handedOff bool
}

func newPopRole() popRole {
	return popRole{Role: poprole.New()}
}

// serve handles the port's messages until ctx is cancelled or srv closes,
// while the port's role is its own. Stopping, it waits for a popping Recv
// to leave: Close deregisters the inbox, which that Recv's messages are
// in, once serve is done.
func (n *Node) serve(ctx context.Context) {
	defer close(n.done)
	defer n.pop.Stop()
	n.pop.Serve(ctx, n.batch) // ctx's error or the port's: either way the Node stops serving
}

// batch pops the port once and handles what came: leave when it handed a
// call (or message) to a Recv, which takes the role next.
func (n *Node) batch(ctx context.Context) (leave bool, err error) {
	r := &n.pop
	k, err := n.srv.PopMsgsWait(ctx, r.msgs[:])
	if err != nil {
		return false, err
	}
	n.handleAll(ctx, r.msgs[:k])
	return r.handedOff, nil
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
	if !r.TryTake() {
		return popNone
	}
	if q.count.Load() > 0 { // queued by the holder before it left the role
		r.Lend()
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
			r.Lend()
			if own {
				return popOwn
			}
			return popHanded
		case err != nil:
			if wctx.Err() != nil {
				r.Return()
			} else {
				r.Fail()
			}
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
