package core

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
)

// Group lets one goroutine serve many queues: it waits, as PopWait does
// (polling the node's completion queue, then sleeping), until any member
// has news. krcored drives all of one client's VQs with one goroutine this
// way, so a client with many VQs gets no more of the daemon's CPU than a
// client with one.
//
// A Group is used by one goroutine at a time.
type Group struct {
	rt *Runtime
	// self stands for the group's waiter in the runtime's waiting
	// machinery (its waker and the completion-queue role); it is never
	// registered, so no request ever reaches it.
	self *Queue
}

// Group makes an empty group.
func (rt *Runtime) Group() *Group {
	return &Group{rt: rt, self: &Queue{rt: rt}}
}

// Add makes q's completions, messages and returned credits wake the
// group's waiter. A queue belongs to one group at most; Add moves it.
func (g *Group) Add(q *Queue) { q.group.Store(g.self) }

// Remove stops q waking the group.
func (g *Group) Remove(q *Queue) { q.group.CompareAndSwap(g.self, nil) }

// Wake wakes the group's waiter for an event outside the runtime (a
// client's doorbell).
func (g *Group) Wake() { g.rt.kick(g.self) }

// Wait returns when work reports true: it calls work, polls the node's
// completion queue (dispatching what it finds to every queue) and calls it
// again, spinning briefly, then sleeps until a member queue or Wake wakes
// it, ctx ends or the runtime closes. work should do what it found to do
// without blocking. arm, if not nil, runs once before each sleep, before a
// last call of work: it tells outside wakers (see Wake) that the waiter is
// about to sleep, so no wake-up is lost.
func (g *Group) Wait(ctx context.Context, work func() bool, arm func()) error {
	if err := g.rt.sends.wait(ctx, g.self, work, arm); err != nil {
		return fmt.Errorf("core: group wait: %w", err)
	}
	return nil
}

// Poll polls the node's completion queue and dispatches what it finds to
// every queue; a goroutine that serves its group without sleeping in Wait
// (spinning) calls it between looks at its queues.
func (g *Group) Poll() { g.rt.sends.poll() }

// SpinPays reports whether polling the node's completion queue (Poll)
// gets completions as soon as sleeping in Wait does. It does not on a
// device that makes progress in the waiting goroutine
// (verbs.DeviceAttr.ProgressInWait: the soft RNIC over TCP, whose waiter
// reads the link itself): there a poller gets them later, handed over by
// the device's own reader, and holds a core that reader needs.
func (g *Group) SpinPays() bool { return !g.rt.sends.noSpin }

// Pop moves q's finished completions into out, as Queue.Pop does, without
// polling the completion queue: Wait and Poll poll it once for the whole
// group.
func (g *Group) Pop(q *Queue, out []krcore.Completion) int { return q.popReady(out) }
