//go:build linux && cgo && rdma

package ibverbs

import (
	"fmt"
	"sync"

	"github.com/krcore/krcore/verbs"
)

// srq is a shared receive queue. Like a QP's receive queue it holds a slot
// per posted receive until the receive's completion is polled, whichever QP
// it completes on.
type srq struct {
	p      *pd
	c      *cSRQ
	maxWR  int
	maxSGE int

	mu      sync.Mutex // guards the fields below and the C scratch
	closed  bool
	nqp     int
	slots   *slotTable
	scratch *postScratch
}

// CreateSRQ creates a shared receive queue of init.MaxWR receives.
func (p *pd) CreateSRQ(init verbs.SRQInit) (verbs.SRQ, error) {
	if err := p.d.own("CreateSRQ"); err != nil {
		return nil, err
	}
	defer p.d.mu.Unlock()
	if err := p.live("CreateSRQ"); err != nil {
		return nil, err
	}
	at := p.d.info.attr
	if !at.SRQSupported {
		return nil, fmt.Errorf("ibverbs: CreateSRQ: device %s has no SRQs: %w", p.d.name, verbs.ErrUnsupported)
	}
	if init.MaxSGE == 0 {
		init.MaxSGE = 1
	}
	if init.MaxWR <= 0 || init.MaxWR > at.MaxSRQWR || init.MaxSGE < 0 || init.MaxSGE > at.MaxSGE {
		return nil, fmt.Errorf("ibverbs: CreateSRQ(%d WRs, %d SGEs): device allows %d and %d: %w", init.MaxWR, init.MaxSGE, at.MaxSRQWR, at.MaxSGE, verbs.ErrLimit)
	}
	c, err := createSRQ(p.c, init.MaxWR, init.MaxSGE)
	if err != nil {
		return nil, err
	}
	s := &srq{p: p, c: c, maxWR: init.MaxWR, maxSGE: init.MaxSGE, slots: newSlotTable(init.MaxWR), scratch: newPostScratch(init.MaxSGE)}
	p.d.srqs[s] = struct{}{}
	p.nqp++
	return s, nil
}

// PostRecv queues receives every QP using the SRQ draws from.
func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if err := s.p.d.use("SRQ PostRecv"); err != nil {
		return 0, err
	}
	defer s.p.d.mu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("ibverbs: PostRecv on SRQ: %w", verbs.ErrClosed)
	}
	return postRecvs(wrs, s.slots, s.maxSGE, kindSRQ, s.scratch, func(n int) (int, error) {
		return postRecv(nil, s.c, s.scratch, n)
	}, func() string { return "SRQ" })
}

// complete restores the caller's ID of an SRQ receive and frees its slot.
func (s *srq) complete(wc *verbs.WC, key uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.slots.release(key); ok {
		wc.ID = id
	}
}

func (s *srq) addUser(n int) {
	s.mu.Lock()
	s.nqp += n
	s.mu.Unlock()
}

// Close destroys the SRQ; it fails with ErrBusy while QPs use it.
func (s *srq) Close() error {
	if err := s.p.d.own("close SRQ"); err != nil {
		return err
	}
	defer s.p.d.mu.Unlock()
	s.mu.Lock()
	closed, busy := s.closed, s.nqp
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("ibverbs: close SRQ: %w", verbs.ErrClosed)
	}
	if busy > 0 {
		return fmt.Errorf("ibverbs: close SRQ used by %d QPs: %w", busy, verbs.ErrBusy)
	}
	delete(s.p.d.srqs, s)
	return s.destroyLocked()
}

// destroyLocked frees the SRQ; the device lock is held exclusively.
func (s *srq) destroyLocked() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := destroySRQ(s.c)
	s.scratch.free()
	s.p.nqp--
	return err
}
