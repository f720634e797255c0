// Package poprole holds the role of popping a port: who waits in the
// port's PopMsgsWait and handles what comes, a serving goroutine or a
// goroutine waiting for something the port brings.
//
// When the serving goroutine pops, a message for a waiting goroutine is
// handed from it to the waiter, and the goroutine that read the message
// off the link (krcore's waiter on its receive queue, which on the soft
// RNIC reads the shared-memory link itself) is often a third: each
// hand-off a wake-up, on a loaded machine of two cores tens of
// microseconds against a few for the message itself (MEASUREMENTS.md,
// session 18). So the role moves: a waiter with nothing to take takes it
// when it is free and pops the port itself, handling whatever comes, its
// own message included, with no hand-off (smc's readers and writers,
// lite's Recvs).
//
// A waiter that got what it waited for lends the role (Lend) while its
// application works: its next wait takes it back without waking anyone.
// Nobody pops a role lent or free, so the serving goroutine (Serve) takes
// it back after LendFor; at once when goroutines need it to pop (Need: they
// wait for something only a popper brings while the holder may be away),
// when a waiter returned it (Return: its wait ended with nothing to keep
// it), or when a waiter's pop failed (Fail: the serving goroutine pops
// next, and meets the failure itself). After a batch that woke a waiter,
// the serving goroutine leaves the role free for it, unless goroutines
// need it to pop. In a patient role (NewPatient) need hurries nothing.
package poprole

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// State is who holds the role.
type State int

// States of a Role.
const (
	Serving State = iota // the serving goroutine pops
	Popping              // a waiter pops
	Free                 // nobody pops: a waiter takes it, the serving goroutine after LendFor
	Stopped              // the serving goroutine stopped: nobody pops
)

// LendFor is how long the role may stay free before the serving goroutine
// takes it back: it bounds how late a message that no waiter pops is
// handled.
const LendFor = time.Millisecond

// FreshFor is how long a waiter of a patient role counts as fresh, at
// least (twice as long at most): one that waited longer is idle, and a
// message for it may wait LendFor more, 2% of what it waited. A waiter
// for a reply that takes less (a ping-pong on a hundred connections at
// once on a loaded machine: a few milliseconds) stays fresh.
const FreshFor = 50 * time.Millisecond

// Role is the role of popping one port. Make it with New.
type Role struct {
	mu    sync.Mutex
	by    State
	since time.Time // when the role was left free: zero is at once for the serving goroutine
	need  int       // goroutines that need the serving goroutine to pop
	// failing: a waiter's pop failed (the port, not its wait): the
	// serving goroutine pops next.
	failing bool
	patient bool // only fresh waiters hurry the serving goroutine (NewPatient)
	// In a patient role, the waiters TakeOrWait counted and Unwait did
	// not uncount yet, by when they began: in period (of FreshFor since
	// start) and the one before.
	start     time.Time
	period    int64
	cur, prev int
	wake      chan struct{} // the serving goroutine's: the role may be its now
	left      chan struct{} // a popping waiter left: Stop waits for it
}

// New is a role the serving goroutine holds.
func New() *Role {
	return &Role{by: Serving, wake: make(chan struct{}, 1), left: make(chan struct{}, 1)}
}

// NewPatient is a role the serving goroutine holds, in which only fresh
// waiters hurry it: those TakeOrWait counted less than FreshFor to
// 2*FreshFor ago. Goroutines waiting longer (idle), or counted by Need, do
// not: the serving goroutine leaves the role free after a batch that
// woke a waiter and takes a lent role back after LendFor, as if they did
// not wait; a message for one of them so waits for the next waiter to
// take the role, or LendFor at most, as a message nobody waits for does.
// It is for ports with many goroutines waiting at once, most of them idle
// (smc's readers, one a connection), where a role taken back at once for
// any of them stays with the serving goroutine for good, and every
// message to a busy waiter is a hand-off (a wake-up) instead of its own
// pop.
func NewPatient() *Role {
	r := New()
	r.patient, r.start = true, time.Now()
	return r
}

// hurried reports whether goroutines need the serving goroutine to pop at
// once; r.mu held.
func (r *Role) hurried() bool {
	if !r.patient {
		return r.need > 0
	}
	r.rotate()
	return r.cur+r.prev > 0
}

// rotate moves the fresh waiters' counts to the current period; r.mu
// held, r.patient.
func (r *Role) rotate() {
	p := int64(time.Since(r.start) / FreshFor)
	switch {
	case p == r.period:
		return
	case p == r.period+1:
		r.prev = r.cur
	default:
		r.prev = 0
	}
	r.cur, r.period = 0, p
}

// State is who holds the role now.
func (r *Role) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by
}

// TryTake gives the role to a waiter if it is free.
func (r *Role) TryTake() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.take()
}

// TakeOrWait gives the role to a waiter if it is free, or else counts the
// waiter as needing the serving goroutine to pop (Need); it reports
// which. Unwait with the ticket undoes the count. In a patient role the
// waiter counted is a fresh one until it has waited FreshFor or more.
func (r *Role) TakeOrWait() (taken bool, ticket int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.take() {
		return true, 0
	}
	r.need++
	if !r.patient {
		return false, 0
	}
	r.rotate()
	r.cur++
	return false, r.period + 1
}

// Unwait undoes TakeOrWait's count of a waiter with its ticket.
func (r *Role) Unwait(ticket int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.need--
	if ticket == 0 {
		return
	}
	r.rotate()
	switch p := ticket - 1; {
	case p == r.period && r.cur > 0:
		r.cur--
	case p == r.period-1 && r.prev > 0:
		r.prev--
	}
}

// take gives the role to a waiter if it is free; r.mu held.
func (r *Role) take() bool {
	if r.by != Free || r.failing {
		return false
	}
	r.by = Popping
	return true
}

// Need counts a goroutine waiting for something only a popper brings:
// the serving goroutine takes a role free or lent at once, and keeps it
// after its batches, until Unneed. In a patient role it does not hurry
// the serving goroutine: a goroutine counted so waits patiently.
func (r *Role) Need() {
	r.mu.Lock()
	r.need++
	free := r.by == Free && !r.patient
	r.mu.Unlock()
	if free {
		signal(r.wake)
	}
}

// Needing is how many goroutines count as needing the serving goroutine
// to pop (Need, TakeOrWait).
func (r *Role) Needing() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.need
}

// Unneed undoes Need's count.
func (r *Role) Unneed() { r.Unwait(0) }

// Lend is a popping waiter leaving with what it waited for: the role is
// free, for the serving goroutine after LendFor, at once if goroutines
// need it to pop.
func (r *Role) Lend() {
	r.leave(time.Now(), false)
}

// Return is a popping waiter leaving with nothing (its wait ended): the
// role is the serving goroutine's at once.
func (r *Role) Return() {
	r.leave(time.Time{}, false)
}

// Fail is a popping waiter leaving because its pop failed: the role is
// the serving goroutine's at once, and no waiter takes it before the
// serving goroutine pops well.
func (r *Role) Fail() {
	r.leave(time.Time{}, true)
}

// leave frees the role, left at since, and wakes the serving goroutine
// when it is to take it at once.
func (r *Role) leave(since time.Time, failed bool) {
	r.mu.Lock()
	r.by, r.since = Free, since
	r.failing = r.failing || failed
	wake := since.IsZero() || r.hurried()
	r.mu.Unlock()
	signal(r.left)
	if wake {
		signal(r.wake)
	}
}

// Serve pops the port while the role is the serving goroutine's, one
// batch a call, until ctx ends (its error) or batch fails (batch's
// error). batch's leave says the batch woke a waiter: the serving
// goroutine then leaves the role free for it, unless goroutines need it
// to pop, and lets it run.
func (r *Role) Serve(ctx context.Context, batch func(context.Context) (leave bool, err error)) error {
	t := time.NewTimer(LendFor)
	defer t.Stop()
	for {
		ok, wait := r.takeForServe()
		if !ok {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.wake:
			case <-t.C:
			}
			continue
		}
		leave, err := batch(ctx)
		if err != nil {
			return err
		}
		r.leaveServe(leave)
		if leave {
			// The waiter woken runs now, here: it spins with yields,
			// or sleeps woken onto this P, and this goroutine's next
			// wait may poll the port a while, or block its thread in
			// a system call (the soft RNIC's shared-memory link sleeps
			// on a futex), before the waiter runs (lite: 1.9-2.3 us
			// from a hand-off to Recv returning, 0.4 with this; smc:
			// 13-46 us a message across processes on two cores).
			runtime.Gosched()
		}
	}
}

// Stop is the serving goroutine stopping: nobody pops again. It waits for
// a popping waiter to leave (the caller wakes it: it closes the port), so
// that whoever waits for the serving goroutine to stop may free what the
// waiter's messages are in.
func (r *Role) Stop() {
	for {
		r.mu.Lock()
		if r.by != Popping {
			r.by = Stopped
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		<-r.left
	}
}

// takeForServe gives the role to the serving goroutine if it is its own,
// or free for LendFor, or free and needed or failing; otherwise it
// reports how long to wait before asking again.
func (r *Role) takeForServe() (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.by {
	case Serving:
		return true, 0
	case Popping:
		return false, LendFor
	}
	if left := LendFor - time.Since(r.since); left > 0 && !r.hurried() && !r.failing {
		return false, left
	}
	r.by = Serving
	return true, 0
}

// leaveServe is the serving goroutine done with a batch that popped well:
// it leaves the role free when told to, unless goroutines need it to pop.
func (r *Role) leaveServe(leave bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = false
	if leave && !r.hurried() {
		r.by, r.since = Free, time.Now()
	}
}

// signal leaves a token in ch if it has room.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
