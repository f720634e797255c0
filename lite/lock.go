package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// A Lock is a ticket lock in an LMR at its master, driven by one-sided
// RDMA from every node that uses it: taking a ticket is one FetchAdd, a
// free lock is claimed with one CompareSwap, Unlock hands it on with one
// CompareSwap, and waiters READ the state, spinning briefly, then
// sleeping with backoff. The master's CPU takes no part, as in LITE's
// one-sided design, and tickets make it FIFO: the order of acquisition is
// the order the master's RNIC served the FetchAdds.
//
// The LMR holds three words:
//
//	0:  state: next ticket (bits 40-63), ticket served (16-39), held (bit 0)
//	8:  beat: bumped by the holder every quarter lease
//	16: the lease, in nanoseconds, written by the master
//
// A holder that dies is found by its silence: a waiter that sees neither
// the state's served ticket and held bit nor the beat change for a lease
// (per ticket between it and the one served) takes the lock over with one
// CompareSwap, and knows whether a holder had it (ErrLockBroken) or the
// ticket was never claimed. Each waiter times the silence on its own
// clock, so no two clocks are compared.
const (
	lockPrefix = "lite.lock/"
	lockSize   = 24
	offState   = 0
	offBeat    = 8
	offLease   = 16

	tickBits  = 24
	tickMask  = 1<<tickBits - 1
	nextShift = 40
	servShift = 16
	heldBit   = 1
	oneTicket = 1 << nextShift

	spinPolls = 8                     // polls before the first sleep
	minSleep  = 16 * time.Microsecond // the first sleep, doubled up to maxSleep
	maxSleep  = time.Millisecond

	// ticketGrace is how long past its context's end a Lock or Unlock
	// waits for a request that changes the lock's state.
	ticketGrace = 100 * time.Millisecond
)

// DefaultLease is a lock's lease when NewLock is given none.
const DefaultLease = time.Second

// ErrLockBroken: a holder of the lock lost it without Unlock, because it
// fell silent for a lease (its Node closed, its process died, or it could
// not reach the master). Lock returns it wrapped while holding the lock:
// the state the lock protects may be half-updated. Unlock returns it when
// the caller's own hold was broken.
var ErrLockBroken = errors.New("lite: lock broken: a holder's lease expired")

// errRequeue: the served ticket passed the caller's while it waited (a
// waiter took the lock over past it); it takes a new ticket.
var errRequeue = errors.New("lite: lock: ticket passed over")

// LockOption configures a lock made by NewLock.
type LockOption func(*lockOptions)

type lockOptions struct {
	lease time.Duration
}

// Lease sets how long a holder may be silent before a waiter breaks the
// lock. The holder renews it four times per lease while it holds.
func Lease(d time.Duration) LockOption {
	return func(o *lockOptions) { o.lease = d }
}

// Lock is a distributed lock, FIFO under contention, whose holder keeps it
// by a lease. Its methods are safe for concurrent use: like a sync.Mutex,
// it is held by one caller at a time, and Unlock releases the current
// hold.
type Lock struct {
	n     *Node
	name  string
	h     Handle
	lease time.Duration
	lmr   *LMR // at the master; nil elsewhere

	mu      sync.Mutex
	holding bool
	ticket  uint32
	state   uint64        // the state word as the holder set it
	stop    chan struct{} // closed to stop the hold's renewal
	renewal *time.Timer   // starts it
	renewed chan struct{} // closed once the renewal stopped
}

// The state word's fields.
func nextOf(w uint64) uint32    { return uint32(w>>nextShift) & tickMask }
func servingOf(w uint64) uint32 { return uint32(w>>servShift) & tickMask }
func heldOf(w uint64) bool      { return w&heldBit != 0 }

// serving is w with ticket s served, held or not; next is unchanged.
func serving(w uint64, s uint32, held bool) uint64 {
	w = w&^(tickMask<<servShift|heldBit) | uint64(s&tickMask)<<servShift
	if held {
		w |= heldBit
	}
	return w
}

// ahead is how many tickets t comes after s, negative if before, in the
// tickets' wrapping arithmetic.
func ahead(t, s uint32) int32 {
	return int32((t-s)&tickMask<<(32-tickBits)) >> (32 - tickBits)
}

// move is what a waiter does on seeing the lock's state.
type move int

const (
	stay    move = iota // wait on
	take                // take the lock (claim it, or break it)
	requeue             // the served ticket passed the waiter's
)

// decide is a waiter's move: ticket t sees state w after silence (the
// time nothing but the next ticket changed). Its turn on a free lock: take
// it. A line silent for a lease per ticket ahead of it: break it, unless
// the waiter only hands its ticket on (pass), which leaves breaking to a
// waiter that wants the lock.
func decide(t uint32, w uint64, silence, lease time.Duration, pass bool) move {
	d := ahead(t, servingOf(w))
	switch {
	case d < 0:
		return requeue
	case d == 0 && !heldOf(w):
		return take
	case !pass && silence > lease*time.Duration(max(d, 1)):
		return take
	}
	return stay
}

// NewLock makes a lock named name mastered by this Node, in an LMR it
// allocates; other nodes open it with OpenLock. The lease (option Lease,
// DefaultLease otherwise) bounds how long a silent holder keeps it.
func (n *Node) NewLock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	o := lockOptions{lease: DefaultLease}
	for _, f := range opts {
		f(&o)
	}
	if name == "" || len(lockPrefix)+len(name) > maxName || o.lease <= 0 {
		return nil, fmt.Errorf("lite: new lock %q with lease %v: %w", name, o.lease, krcore.ErrInvalid)
	}
	lmr, err := n.Malloc(ctx, lockPrefix+name, lockSize, Read|Atomic)
	if err != nil {
		return nil, fmt.Errorf("lite: new lock %q: %w", name, err)
	}
	binary.LittleEndian.PutUint64(lmr.Bytes()[offLease:], uint64(o.lease))
	l, err := n.OpenLock(ctx, n.api.Node(), name)
	if err != nil {
		lmr.Free()
		return nil, err
	}
	l.lmr = lmr
	return l, nil
}

// OpenLock opens the lock called name mastered by master.
func (n *Node) OpenLock(ctx context.Context, master krcore.NodeID, name string) (*Lock, error) {
	if name == "" || len(lockPrefix)+len(name) > maxName {
		return nil, fmt.Errorf("lite: open lock %q: %w", name, krcore.ErrInvalid)
	}
	h, err := n.Map(ctx, master, lockPrefix+name, Read|Atomic)
	if err != nil {
		return nil, fmt.Errorf("lite: open lock %q: %w", name, err)
	}
	var b [8]byte
	err = n.onSync(ctx, h, offLease, verbs.OpRead, 0, 0, b[:])
	lease := time.Duration(binary.LittleEndian.Uint64(b[:]))
	if err == nil && lease <= 0 {
		err = fmt.Errorf("no lease set: %w", krcore.ErrInvalid)
	}
	if err != nil {
		n.Unmap(ctx, h)
		return nil, fmt.Errorf("lite: open lock %q at node %d: %w", name, master, err)
	}
	return &Lock{n: n, name: name, h: h, lease: lease}, nil
}

// Lock waits, within ctx, until the caller holds the lock, in the order
// callers asked for it. It returns an error wrapping ErrLockBroken while
// holding the lock if a holder before it lost the lock without Unlock.
// A caller that gives up (ctx) leaves its place in the line to a goroutine
// of the Node, which hands the lock on at once when its turn comes; if
// ctx ends just as the lock is taken, Lock returns nil holding it.
func (l *Lock) Lock(ctx context.Context) error {
	for {
		gctx, cancel := grace(ctx)
		w, err := l.faa(gctx, offState, oneTicket)
		cancel()
		if err != nil {
			// A FetchAdd abandoned may have taken a ticket no one knows:
			// the line breaks past it after a lease, as for one never
			// claimed, and no one is told the lock was broken.
			return fmt.Errorf("lite: lock %q: %w", l.name, err)
		}
		t := nextOf(w)
		if err := ctx.Err(); err != nil {
			l.handOn(t)
			return fmt.Errorf("lite: lock %q: %w", l.name, err)
		}
		w, broken, err := l.wait(ctx, t, w+oneTicket, false)
		if errors.Is(err, errRequeue) {
			continue
		}
		if err != nil {
			l.handOn(t)
			return fmt.Errorf("lite: lock %q: %w", l.name, err)
		}
		l.hold(t, w)
		if broken {
			return fmt.Errorf("lite: lock %q: %w", l.name, ErrLockBroken)
		}
		return nil
	}
}

// wait polls the lock's state w until ticket t takes it: it returns the
// state it set, and whether a holder had lost the lock. With pass, it
// hands the lock on to the next ticket instead of holding it.
func (l *Lock) wait(ctx context.Context, t uint32, w uint64, pass bool) (uint64, bool, error) {
	q := newQuiet(time.Now(), l.lease/8)
	for polls := 0; ; polls++ {
		switch decide(t, w, q.silence(), l.lease, pass) {
		case requeue:
			return 0, false, errRequeue
		case take:
			nw := serving(w, t, true)
			if pass {
				nw = serving(w, t+1, false)
			}
			gctx, cancel := grace(ctx)
			old, err := l.cas(gctx, offState, w, nw)
			cancel()
			if err != nil {
				return 0, false, err
			}
			if old == w {
				return nw, heldOf(w), nil
			}
			w = old // changed meanwhile: decide again on what it is now
			q.see(w, q.beat, time.Now())
			continue
		}
		if err := pause(ctx, polls); err != nil {
			return 0, false, err
		}
		var beat uint64
		var err error
		if w, beat, err = l.peek(ctx); err != nil {
			return 0, false, err
		}
		q.see(w, beat, time.Now())
	}
}

// quiet times a lock's silence: since when its served ticket, held bit
// and beat have not changed, as a waiter saw them (the next ticket is not
// part of it: queuing is no sign of the holder's life). Only time the
// waiter was looking counts: a gap between two looks longer than absent
// is the waiter's own absence (its goroutine or process did not run),
// and the holder, on the same host or in the same process, may not have
// run either; a holder elsewhere that renewed meanwhile shows a new beat
// at the next look anyway.
type quiet struct {
	state, beat uint64
	since, last time.Time // the silence's start (as counted), the last look
	absent      time.Duration
}

// newQuiet starts timing a silence at now.
func newQuiet(now time.Time, absent time.Duration) quiet {
	return quiet{since: now, last: now, absent: absent}
}

// silence is how long the lock had been silent at the last look.
func (q *quiet) silence() time.Duration { return q.last.Sub(q.since) }

// see records the state and beat seen at now; a change ends the silence.
// A waiter sees the state in every answer, a CompareSwap's too: a take
// that failed because the lock moved on must not break the new holder on
// the old holder's silence.
func (q *quiet) see(w, beat uint64, now time.Time) {
	if gap := now.Sub(q.last); gap > q.absent {
		q.since = q.since.Add(gap - q.absent)
	}
	q.last = now
	if s := w &^ (tickMask << nextShift); s != q.state || beat != q.beat {
		q.state, q.beat, q.since = s, beat, now
	}
}

// grace is ctx for a request that changes the lock's state: its
// completion is awaited up to ticketGrace past ctx's end, so that a
// ticket taken, a claim or a hand-off is known to the caller rather than
// made and unknown, which would hold the line for a lease.
func grace(ctx context.Context) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(ticketGrace, cancel) })
	return gctx, func() { stop(); cancel() }
}

// pause is the wait before a waiter's next poll: none for the first few,
// then sleeps doubling up to maxSleep.
func pause(ctx context.Context, polls int) error {
	if polls < spinPolls {
		runtime.Gosched()
		return ctx.Err()
	}
	d := min(minSleep<<min(polls-spinPolls, 16), maxSleep)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handOn leaves ticket t, whose waiter gave up, to a goroutine of the
// Node that hands the lock on when t's turn comes. If the Node closes
// first, the line breaks past t after a lease.
func (l *Lock) handOn(t uint32) {
	l.n.sync.spawn(func(ctx context.Context) {
		if w, _, err := l.peek(ctx); err == nil {
			l.wait(ctx, t, w, true)
		}
	})
}

// hold records that the caller holds the lock with ticket t and state w,
// and starts renewing the lease a quarter lease from now: a short hold
// starts no goroutine.
func (l *Lock) hold(t uint32, w uint64) {
	stop, renewed := make(chan struct{}), make(chan struct{})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holding, l.ticket, l.state, l.stop, l.renewed = true, t, w, stop, renewed
	l.renewal = time.AfterFunc(l.lease/4, func() {
		if !l.n.sync.spawn(func(ctx context.Context) { l.renew(ctx, t, stop); close(renewed) }) {
			close(renewed)
		}
	})
}

// unhold ends the caller's hold and its renewal; l.mu held. The renewal
// has ended once the channel it returns is closed.
func (l *Lock) unhold() chan struct{} {
	l.holding = false
	close(l.stop)
	if l.renewal.Stop() {
		close(l.renewed) // it never started
	}
	return l.renewed
}

// renew bumps the beat every quarter lease while ticket t holds the lock,
// until stop or the Node closes. It stops if the lock is no longer t's,
// so that a holder that lost it never keeps the next holder's silence
// from being seen. A renewal may take up to half a lease (the next starts
// when it ends, if its quarter passed): one abandoned sooner is silence
// the holder made itself, where its operations are slow (through
// krcored, on a loaded machine), while bumps at most a quarter plus a
// half lease apart keep the lease.
func (l *Lock) renew(ctx context.Context, t uint32, stop chan struct{}) {
	tick := time.NewTicker(l.lease / 4)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, l.lease/2)
		w, _, err := l.peek(rctx)
		if err == nil && (servingOf(w) != t || !heldOf(w)) {
			cancel()
			return
		}
		if err == nil {
			l.faa(rctx, offBeat, 1) // a failure is silence: the lease may expire
		}
		cancel()
		select {
		case <-tick.C:
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Unlock releases the caller's hold and hands the lock to the next
// ticket. It returns an error wrapping ErrLockBroken if the hold was
// broken meanwhile (the holder fell silent for a lease, and another may
// have held the lock since). Unlocking a lock not held is ErrInvalid. If
// Unlock fails otherwise, the hold ends without a hand-off, and the line
// breaks past it after a lease.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if !l.holding {
		l.mu.Unlock()
		return fmt.Errorf("lite: unlock %q: not held: %w", l.name, krcore.ErrInvalid)
	}
	t, w := l.ticket, l.state
	renewed := l.unhold()
	l.mu.Unlock()
	<-renewed
	ctx, cancel := grace(ctx)
	defer cancel()
	for {
		old, err := l.cas(ctx, offState, w, serving(w, t+1, false))
		switch {
		case err != nil:
			return fmt.Errorf("lite: unlock %q: %w", l.name, err)
		case old == w:
			return nil
		case servingOf(old) != t || !heldOf(old):
			return fmt.Errorf("lite: unlock %q: %w", l.name, ErrLockBroken)
		}
		w = old // a new ticket was taken meanwhile
	}
}

// Close forgets the lock in this Node: it stops renewing a hold, which a
// waiter then breaks after a lease (as when a holder dies), and unmaps the
// lock; at the master it also frees the lock's memory, after which every
// node's use of it fails.
func (l *Lock) Close(ctx context.Context) error {
	l.mu.Lock()
	if l.holding {
		l.unhold()
	}
	l.mu.Unlock()
	err := l.n.Unmap(ctx, l.h)
	if l.lmr != nil {
		err = errors.Join(err, l.lmr.Free())
	}
	return err
}

// peek READs the lock's state and beat.
func (l *Lock) peek(ctx context.Context) (w, beat uint64, err error) {
	var b [16]byte
	if err := l.n.onSync(ctx, l.h, offState, verbs.OpRead, 0, 0, b[:]); err != nil {
		return 0, 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), binary.LittleEndian.Uint64(b[8:]), nil
}

func (l *Lock) faa(ctx context.Context, off int, add uint64) (uint64, error) {
	return l.n.FetchAdd(ctx, l.h, off, add)
}

func (l *Lock) cas(ctx context.Context, off int, cmp, swap uint64) (uint64, error) {
	return l.n.CompareSwap(ctx, l.h, off, cmp, swap)
}
