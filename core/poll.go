package core

import (
	"context"
	"time"

	"github.com/krcore/krcore/verbs"
)

// recvBit marks the wr_id of the runtime's shared receives.
const recvBit = 1 << 63

// spinFor is how long a waiter polls before it sleeps: long enough to catch
// an in-memory or fast completion, short enough not to starve the other
// core on a two-core machine.
const spinFor = 20 * time.Microsecond

// poll drains the node's completion queue and dispatches every completion
// to the VQ it belongs to. Whoever calls it does the work; if another
// goroutine is already polling it returns at once.
func (rt *Runtime) poll() int {
	if !rt.pollMu.TryLock() {
		return 0
	}
	defer rt.pollMu.Unlock()
	n, err := rt.cq.Poll(rt.wcs)
	if err != nil {
		rt.log.Error("completion queue failed", "err", err)
		return 0
	}
	m := *rt.byQPN.Load()
	fin := rt.fin[:0]
	for i := 0; i < n; i++ {
		wc := &rt.wcs[i]
		if wc.ID&recvBit != 0 {
			rt.recv.onWC(wc)
			continue
		}
		if p := m[wc.QPN]; p != nil {
			fin = p.complete(wc, fin)
		}
	}
	for _, f := range fin {
		f.q.finish(f.seq, f.status, f.n)
	}
	clear(fin)
	rt.fin = fin[:0]
	return n
}

// failRecs finishes records that never reached a QP.
func (rt *Runtime) failRecs(rs []rec, st verbs.Status) {
	for _, r := range rs {
		r.q.finish(r.seq, st, 0)
	}
}

// wait blocks until ready reports true, ctx ends or the runtime closes. The
// caller polls the completion queue itself for a short while; then one
// waiter at a time sleeps on the completion queue (and dispatches what
// wakes it) while the others sleep on their queue's channel, taking the
// role over when it frees.
func (rt *Runtime) wait(ctx context.Context, q *Queue, ready func() bool) error {
	token := false // this goroutine took the role hand-over token
	defer func() {
		if token {
			rt.passRole()
		}
	}()
	start := time.Now()
	for i := 0; ; i++ {
		if ready() {
			return nil
		}
		if rt.poll() > 0 && ready() {
			return nil
		}
		if i%32 != 31 || time.Since(start) < spinFor {
			continue
		}
		if err := rt.sleep(ctx, q, &token); err != nil {
			return err
		}
	}
}

// sleep waits once for something to happen.
func (rt *Runtime) sleep(ctx context.Context, q *Queue, token *bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-rt.stop:
		return ErrClosed
	default:
	}
	if rt.waitMu.TryLock() {
		*token = false
		err := rt.sleepOnCQ(ctx, q)
		rt.waitMu.Unlock()
		rt.passRole()
		return err
	}
	select {
	case <-q.notify:
	case <-rt.wake:
		*token = true
	case <-ctx.Done():
		return ctx.Err()
	case <-rt.stop:
		return ErrClosed
	}
	return nil
}

// passRole lets one sleeping waiter take the completion-queue role.
func (rt *Runtime) passRole() {
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

// roleHolder is the waiter sleeping on the completion queue; a dispatcher
// that finishes its request cancels its sleep, because another poller may
// have taken the completion that would have woken it.
type roleHolder struct {
	q      *Queue
	cancel context.CancelFunc
}

func (rt *Runtime) sleepOnCQ(ctx context.Context, q *Queue) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rt.role.Store(&roleHolder{q: q, cancel: cancel})
	defer rt.role.Store(nil)
	select {
	case <-q.notify: // finished while the role was being taken
		return nil
	default:
	}
	err := rt.cq.Wait(cctx)
	if err != nil && ctx.Err() == nil {
		return nil // woken by a dispatcher
	}
	return err
}

// kick wakes q's waiter, wherever it sleeps.
func (rt *Runtime) kick(q *Queue) {
	select {
	case q.notify <- struct{}{}:
	default:
	}
	if r := rt.role.Load(); r != nil && r.q == q {
		r.cancel()
	}
}
