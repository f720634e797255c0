package soft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

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
	node  *Node
	ring  []cqe
	ready atomic.Int32 // entries in the ring, read without the lock by Poll
	users atomic.Int32 // QPs using the CQ

	mu      sync.Mutex
	head    int
	n       int
	overrun bool
	closed  bool
	waiters int
	bell    chan struct{} // a token for one Wait caller; it passes it on
}

// CreateCQ creates a completion queue of cqe entries.
func (n *Node) CreateCQ(entries int) (verbs.CQ, error) {
	if entries <= 0 || entries > n.attr.MaxCQE {
		return nil, fmt.Errorf("soft: CQ of %d entries (max %d): %w", entries, n.attr.MaxCQE, verbs.ErrInvalid)
	}
	if err := n.reserve(&n.counts.cq, n.attr.MaxCQ, "CQ"); err != nil {
		return nil, err
	}
	c := &cq{node: n, ring: make([]cqe, entries), bell: make(chan struct{}, 1)}
	n.mu.Lock()
	n.cqs[c] = struct{}{}
	n.mu.Unlock()
	return c, nil
}

func (c *cq) Cap() int { return len(c.ring) }

// push adds a completion. It reports false when the CQ is full: the entry
// is lost and the CQ is overrun, as on hardware.
func (c *cq) push(e cqe) bool {
	c.mu.Lock()
	if c.closed || c.overrun {
		c.mu.Unlock()
		return false
	}
	if c.n == len(c.ring) {
		c.overrun = true
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

// wake hands a Wait caller the token; c.mu is held.
func (c *cq) wake() {
	if c.waiters > 0 {
		select {
		case c.bell <- struct{}{}:
		default:
		}
	}
}

var errCQOverrun = fmt.Errorf("soft: CQ overrun, completions were lost: %w", verbs.ErrCQOverrun)

func (c *cq) Poll(wc []verbs.WC) (int, error) {
	if c.ready.Load() == 0 {
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
	c.ready.Store(int32(c.n))
	c.mu.Unlock()
	for _, r := range retire[:nr] {
		r.q.retire(r.sqIdx)
	}
	return k, nil
}

// idleErr is Poll's answer when nothing is queued.
func (c *cq) idleErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.overrun:
		return errCQOverrun
	case c.closed:
		return fmt.Errorf("soft: CQ: %w", verbs.ErrClosed)
	case c.node.closed.Load():
		return errNodeClosed
	}
	return nil
}

func (c *cq) Wait(ctx context.Context) error {
	for {
		if c.ready.Load() > 0 {
			return nil
		}
		c.mu.Lock()
		if c.n > 0 || c.overrun || c.closed || c.node.closed.Load() {
			c.mu.Unlock()
			if c.n > 0 {
				return nil
			}
			return c.idleErr()
		}
		c.waiters++
		c.mu.Unlock()
		select {
		case <-c.bell:
		case <-ctx.Done():
		}
		c.mu.Lock()
		c.waiters--
		if c.n > 0 || c.overrun || c.closed || c.node.closed.Load() {
			c.wake() // pass the token to the next waiter
		}
		c.mu.Unlock()
		if err := ctx.Err(); err != nil && c.ready.Load() == 0 {
			return err
		}
	}
}

func (c *cq) Close() error {
	if u := c.users.Load(); u > 0 {
		return fmt.Errorf("soft: destroy CQ used by %d QPs: %w", u, verbs.ErrBusy)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("soft: CQ: %w", verbs.ErrClosed)
	}
	c.closed = true
	c.wake()
	c.node.release(&c.node.counts.cq)
	c.node.mu.Lock()
	delete(c.node.cqs, c)
	c.node.mu.Unlock()
	return nil
}

// wakeAll wakes every waiter, for a closing node.
func (c *cq) wakeAll() {
	c.mu.Lock()
	c.wake()
	c.mu.Unlock()
}
