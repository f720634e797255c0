package udrpc

import (
	"context"
	"fmt"
	"sync"

	"github.com/krcore/krcore/verbs"
)

// Poller lets the goroutines waiting on one CQ take turns draining it, so
// no goroutine is dedicated to polling and an operation whose completion is
// already queued (the in-memory wire completes inside PostSend) returns
// without a context switch. One waiter at a time leads: it polls, hands
// every completion to handle, and sleeps in CQ.Wait when idle. The others
// wait on their own ready channel and take over when the leader leaves.
type Poller struct {
	cq     verbs.CQ
	handle func(*verbs.WC) // called by the leader, with lead held
	stop   <-chan struct{} // closed when the owner closes
	closed error           // what wait returns once stop is closed

	lead sync.Mutex
	turn chan struct{} // a token: the leader left, a follower may lead
	wcs  [16]verbs.WC  // guarded by lead
}

// NewPoller makes a poller of cq that hands each completion to handle.
// Once stop is closed, waits fail with closed.
func NewPoller(cq verbs.CQ, stop <-chan struct{}, closed error, handle func(*verbs.WC)) *Poller {
	return &Poller{cq: cq, handle: handle, stop: stop, closed: closed, turn: make(chan struct{}, 1)}
}

// Wait returns nil once it has taken the token handle sends on ready, or
// an error when ctx ends, the owner closes, or the CQ fails.
func (p *Poller) Wait(ctx context.Context, ready <-chan struct{}) error {
	for {
		select {
		case <-ready:
			return nil
		default:
		}
		if p.lead.TryLock() {
			err := p.leadUntil(ctx, ready)
			p.lead.Unlock()
			select {
			case p.turn <- struct{}{}:
			default:
			}
			return err
		}
		select {
		case <-ready:
			return nil
		case <-p.turn:
		case <-p.stop:
			return p.closed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Retire waits for the leader, if any, to leave, and keeps anyone from
// leading again: the owner is about to free what handle touches. The
// owner closes stop first, so the leader leaves at its next idle poll
// (its CQ wait ends with the completions of the QP the owner moved to
// ERR, or with its own context) and the followers return.
func (p *Poller) Retire() { p.lead.Lock() }

// leadUntil drains the CQ until ready fires. It sleeps in CQ.Wait as soon
// as a poll finds nothing, without spinning first: a lookup is one READ, and
// on a provider whose waiter reads the wire itself (the soft RNIC over TCP)
// spinning only delays the read that brings the response (a Fetch went from
// 15.6 to 8.3 us, BenchmarkFetch/tcp), while the in-memory wire has completed
// the READ before the first poll.
func (p *Poller) leadUntil(ctx context.Context, ready <-chan struct{}) error {
	for {
		n, err := p.cq.Poll(p.wcs[:])
		for i := range p.wcs[:n] {
			p.handle(&p.wcs[i])
		}
		select {
		case <-ready:
			return nil
		default:
		}
		switch {
		case err != nil:
			return fmt.Errorf("udrpc: poll CQ: %w", err)
		case n > 0:
			continue
		}
		select {
		case <-p.stop:
			return p.closed
		default:
		}
		if err := p.cq.Wait(ctx); err != nil {
			return err
		}
	}
}
