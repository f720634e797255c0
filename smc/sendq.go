package smc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/krcore/krcore"
)

// sharedQueue is a queue connected to a peer endpoint, used by several
// connections at once. A connection does not wait for its requests to
// complete: a WRITE's completion only frees its staging bytes, and a
// failed one aborts the connection, so waiting for it would add a round
// trip on the link (and the wake-up of the goroutine waiting) to every
// Write. Whoever pushes or waits pops every completion that came, in push
// order, and credits each to the connection owed it (owed), which waits
// only when it needs the staging bytes or CDC slot a request still holds;
// the Node's reaper pops them too while requests are in flight, so that a
// WRITE that failed ends its connection within a reapEvery even if the
// connection only reads from then on.
//
// Nobody holds mu while waiting for a completion: one waiter at a time
// (the popper) sleeps in PopWait and the others on credited, so that a
// connection waiting for staging room, for credit or for its last
// requests before its buffers go back does not hold up the pushes of the
// other connections on the queue (a thousand connections closing at once
// queued behind each other's waits for up to opTimeout each).
type sharedQueue struct {
	q krcore.VQ

	mu       sync.Mutex // held to push to q, pop from it without waiting, and for the fields below
	owed     []owed     // the requests in flight, in push order
	nextID   uint64
	outs     [16]krcore.Completion
	popping  bool               // a waiter sleeps in PopWait
	popWake  context.CancelFunc // ends the popper's PopWait: someone else popped
	credited chan struct{}      // closed (and replaced) when the popper credited what it popped

	users  int  // under Node.mu
	broken bool // under Node.mu: a request failed on it; no new user
}

// owed is a request in flight and the connection its completion frees.
type owed struct {
	id  uint64
	c   *Conn
	n   int  // staging bytes of a WRITE
	cdc bool // a CDC message's slot
}

// errQueueIdle is a wait for a completion on a queue with nothing in
// flight: a connection's accounting went wrong.
var errQueueIdle = errors.New("smc: waiting for a completion with no request in flight")

// push pushes r for c, which the completion frees as o says, first
// popping what completed; with no credit left it waits (within opTimeout)
// for completions. A request the queue refused frees what it held at
// once and its error comes back, for the caller to abort the connection
// with (once: the refusal is not also recorded as a failed completion).
func (s *sharedQueue) push(r krcore.Request, o owed) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reap()
	s.nextID++
	r.ID, o.id = s.nextID, s.nextID
	var ctx context.Context
	for {
		// The request is owed before it is pushed: a waiter may pop its
		// completion at once, and credits it under mu, after this.
		s.owed = append(s.owed, o)
		err := s.q.PushOne(context.Background(), false, r)
		if err == nil {
			signal(o.c.node.reapKick)
			return nil
		}
		s.owed[len(s.owed)-1] = owed{} // its Conn is not kept alive by the array
		s.owed = s.owed[:len(s.owed)-1]
		if errors.Is(err, krcore.ErrNoCredit) && len(s.owed) > 0 {
			if ctx == nil {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(context.Background(), opTimeout)
				defer cancel()
			}
			if err = s.waitOne(ctx); err == nil {
				s.reap()
				continue
			}
		}
		o.c.completed(o, nil) // the caller aborts the connection, once
		return err
	}
}

// settle pops completions, waiting for them (within opTimeout and ctx),
// until ok reports true; ok runs with c.mu held.
func (s *sharedQueue) settle(ctx context.Context, c *Conn, ok func() bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	bounded := false
	for {
		s.reap()
		c.mu.Lock()
		done := ok()
		c.mu.Unlock()
		if done {
			return nil
		}
		if len(s.owed) == 0 {
			return errQueueIdle
		}
		if !bounded {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, opTimeout)
			defer cancel()
			bounded = true
		}
		if err := s.waitOne(ctx); err != nil {
			return err
		}
	}
}

// reapEvery is how often a Node's reaper pops the completions of its
// queues while requests are in flight: it bounds how late a connection
// that no longer writes learns that a WRITE of its failed (see
// sharedQueue); pushes and waits pop them at once.
const reapEvery = time.Millisecond

// reaper pops the completions of the Node's queues every reapEvery while
// any has requests in flight, and sleeps on reapKick when none has, until
// ctx ends.
func (n *Node) reaper(ctx context.Context) {
	defer n.wg.Done()
	t := time.NewTimer(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.reapKick:
		}
		for busy := true; busy; {
			t.Reset(reapEvery)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			busy = n.reapAll()
		}
	}
}

// reapAll pops what completed on every queue not in use now, and reports
// whether any still has requests in flight.
func (n *Node) reapAll() bool {
	n.mu.Lock()
	var qs []*sharedQueue
	for _, peer := range n.queues {
		qs = append(qs, peer...)
	}
	n.mu.Unlock()
	busy := false
	for _, s := range qs {
		if !s.mu.TryLock() {
			busy = true // its holder pops
			continue
		}
		s.reap()
		busy = busy || len(s.owed) > 0
		s.mu.Unlock()
	}
	return busy
}

// reap pops what completed, without waiting, and wakes a popper: a
// completion it waits for may be among them; s.mu held.
func (s *sharedQueue) reap() {
	for len(s.owed) > 0 {
		k := s.q.Pop(s.outs[:])
		s.credit(k)
		if k > 0 && s.popWake != nil {
			s.popWake()
		}
		if k < len(s.outs) {
			return
		}
	}
}

// waitOne waits until completions were credited: it pops them itself
// (PopWait, without s.mu) unless another waiter does, then it waits for
// that one to credit what it popped. s.mu is held on entry and on return,
// not while waiting.
func (s *sharedQueue) waitOne(ctx context.Context) error {
	if s.popping {
		if s.credited == nil {
			s.credited = make(chan struct{})
		}
		ch := s.credited
		s.mu.Unlock()
		defer s.mu.Lock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pctx, wake := context.WithCancel(ctx)
	defer wake()
	s.popping, s.popWake = true, wake
	s.mu.Unlock()
	var outs [len(s.outs)]krcore.Completion
	k, err := s.q.PopWait(pctx, outs[:])
	s.mu.Lock()
	s.popping, s.popWake = false, nil
	if s.credited != nil {
		close(s.credited) // the other waiters look again, one of them pops next
		s.credited = nil
	}
	s.creditFrom(outs[:k])
	if errors.Is(err, context.Canceled) && ctx.Err() == nil && pctx.Err() != nil {
		err = nil // woken by reap: what it popped may be what this waiter waits for
	}
	return err
}

// credit hands the first k of s.outs to the connections owed them. They
// come in push order, so the owed request is normally the first; one that
// came out of order is found by its ID, and the requests before it stay
// owed (dropping them would leave their connections waiting for staging
// room that is never freed). A completion owed to no one (not pushed
// here) is ignored; s.mu held.
func (s *sharedQueue) credit(k int) { s.creditFrom(s.outs[:k]) }

// creditFrom is credit of outs; s.mu held.
func (s *sharedQueue) creditFrom(outs []krcore.Completion) {
	for i := range outs {
		out := &outs[i]
		j := slices.IndexFunc(s.owed, func(o owed) bool { return o.id == out.ID })
		if j < 0 {
			continue
		}
		o := s.owed[j]
		if j == 0 {
			s.owed[0] = owed{}
			s.owed = s.owed[1:]
		} else {
			s.owed = slices.Delete(s.owed, j, j+1)
		}
		o.c.completed(o, out.Err())
	}
}

// completed frees what a request of c held, and gives a released
// connection's staging buffer back once nothing reads it; a failure
// aborts c: the peer is gone, or its buffer.
func (c *Conn) completed(o owed, err error) {
	c.mu.Lock()
	if o.cdc {
		c.cdcDone++
	} else {
		c.freed += uint64(o.n)
	}
	node := c.peerNode
	var back buffer
	if c.lateStage.s != nil && c.stageIdle() {
		back, c.lateStage = c.lateStage, buffer{}
	}
	c.mu.Unlock()
	if back.s != nil {
		back.s.pool.put(back) // the released connection's last request: no request reads it now
	}
	if err != nil {
		c.fail(fmt.Errorf("smc: RDMA to node %d: %w: %w", node, errAborted, err))
	}
}
