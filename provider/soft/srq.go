package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/verbs"
)

// srq is a shared receive queue.
type srq struct {
	pd     *pd
	maxSGE int
	users  atomic.Int32

	mu sync.Mutex
	// ring is a stack of the n receives posted: take takes the last.
	ring   []rwqe
	n      int
	closed bool
}

// CreateSRQ creates a shared receive queue.
func (p *pd) CreateSRQ(init verbs.SRQInit) (verbs.SRQ, error) {
	n := p.node
	if init.MaxWR <= 0 || init.MaxWR > n.attr.MaxSRQWR || init.MaxSGE < 0 || init.MaxSGE > n.attr.MaxSGE {
		return nil, fmt.Errorf("soft: create SRQ %+v (max %d WRs, %d SGEs): %w", init, n.attr.MaxSRQWR, n.attr.MaxSGE, verbs.ErrLimit)
	}
	if err := n.reserve(&n.counts.srq, n.attr.MaxSRQ, "SRQ"); err != nil {
		return nil, err
	}
	if err := p.use(); err != nil {
		n.release(&n.counts.srq)
		return nil, err
	}
	s := &srq{pd: p, maxSGE: max(init.MaxSGE, 1), ring: make([]rwqe, init.MaxWR)}
	slot := sgeSlots(len(s.ring), s.maxSGE)
	for i := range s.ring {
		s.ring[i].sgl = slot(i)
	}
	if err := track(n, n.srqs, s); err != nil {
		p.refs.Add(-1)
		n.release(&n.counts.srq)
		return nil, err
	}
	return s, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if err := s.pd.node.checkOpen(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range wrs {
		switch {
		case s.closed:
			return i, fmt.Errorf("soft: post SRQ receive: %w", verbs.ErrClosed)
		case len(wrs[i].SGL) > s.maxSGE:
			return i, fmt.Errorf("soft: post SRQ receive with %d SGEs, max %d: %w", len(wrs[i].SGL), s.maxSGE, verbs.ErrLimit)
		case s.n == len(s.ring):
			return i, fmt.Errorf("soft: post SRQ receive: %d posted: %w", s.n, verbs.ErrQueueFull)
		}
		r := &s.ring[s.n]
		r.id = wrs[i].ID
		r.sgl = appendSGL(r.sgl[:0], wrs[i].SGL)
		s.n++
	}
	return len(wrs), nil
}

// take takes the receive posted last. Which posted receive an SRQ's
// message lands in is not ordered for its user (verbs promises none; each
// completion names its WR), and the newest is the one whose buffer is
// likeliest still in cache: a runtime that keeps ~1000 receives posted
// and posts each back once its message is dispatched (core's receiver)
// then reuses the few it just posted instead of walking every buffer, a
// cold line or two written per message (measured in MEASUREMENTS.md,
// "Runtime cost", session 20).
func (s *srq) take(sgl []verbs.SGE) (uint64, []verbs.SGE, bool) {
	// Unlocked on each return, not deferred: every message to a
	// runtime's port takes a receive here.
	s.mu.Lock()
	if s.n == 0 || s.closed {
		s.mu.Unlock()
		return 0, sgl, false
	}
	s.n--
	r := &s.ring[s.n]
	id, sgl := r.id, appendSGL(sgl, r.sgl)
	s.mu.Unlock()
	return id, sgl, true
}

// appendSGL is append(dst, src...) with a receive's usual single entry
// appended by a store: append of a slice is a call to memmove.
func appendSGL(dst, src []verbs.SGE) []verbs.SGE {
	if len(src) == 1 {
		return append(dst, src[0])
	}
	return append(dst, src...)
}

// untake puts a receive take returned back where it was, on top, unless
// the SRQ filled or closed meanwhile.
func (s *srq) untake(id uint64, sgl []verbs.SGE) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.n == len(s.ring) {
		return false
	}
	r := &s.ring[s.n]
	r.id, r.sgl = id, append(r.sgl[:0], sgl...)
	s.n++
	return true
}

func (s *srq) Close() error {
	if u := s.users.Load(); u > 0 {
		return fmt.Errorf("soft: destroy SRQ used by %d QPs: %w", u, verbs.ErrBusy)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("soft: destroy SRQ: %w", verbs.ErrClosed)
	}
	s.closed = true
	s.pd.refs.Add(-1)
	s.pd.node.release(&s.pd.node.counts.srq)
	untrack(s.pd.node, s.pd.node.srqs, s)
	return nil
}
