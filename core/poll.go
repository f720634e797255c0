package core

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/verbs"
)

// recvBit marks the wr_id of the runtime's shared receives.
const recvBit = 1 << 63

// spinFor is how long a waiter polls before it sleeps: long enough to catch
// a completion that is microseconds away, short enough not to hold a core
// that the provider's own goroutines (a link reader) need on a two-core
// machine. While spinning it yields now and then, so a goroutine it woke
// (a peer in the same process) gets to run.
const spinFor = 5 * time.Microsecond

// poller is one of the node's two completion queues (sends, receives) with
// the state of those who poll and wait on it. Separate queues keep a
// goroutine waiting for messages from being woken by every data-plane
// completion.
type poller struct {
	rt     *Runtime
	cq     verbs.CQ
	mu     sync.Mutex // held while polling
	wcs    []verbs.WC
	fin    []finished
	waitMu sync.Mutex // the role of sleeping on the CQ, see wait
	role   atomic.Pointer[roleHolder]
	wake   chan struct{}
	failed atomic.Bool // the CQ failed (device gone); logged once
}

func newPoller(rt *Runtime, entries int) (*poller, error) {
	cq, err := rt.dev.CreateCQ(min(entries, rt.dev.Attr().MaxCQE))
	if err != nil {
		return nil, err
	}
	return &poller{rt: rt, cq: cq, wcs: make([]verbs.WC, 64), wake: make(chan struct{}, 1)}, nil
}

// poll drains the completion queue and dispatches every completion to the
// VQ it belongs to. Whoever calls it does the work; if another goroutine is
// already polling it returns at once.
func (pl *poller) poll() int {
	if !pl.mu.TryLock() {
		return 0
	}
	defer pl.mu.Unlock()
	rt := pl.rt
	n, err := pl.cq.Poll(pl.wcs)
	if err != nil {
		if !pl.failed.Swap(true) {
			rt.log.Error("completion queue failed", "err", err)
		}
		return 0
	}
	m := *rt.byQPN.Load()
	fin := pl.fin[:0]
	for i := 0; i < n; i++ {
		wc := &pl.wcs[i]
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
	pl.fin = fin[:0]
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
func (pl *poller) wait(ctx context.Context, q *Queue, ready func() bool) error {
	token := false // this goroutine took the role hand-over token
	defer func() {
		if token {
			pl.passRole()
		}
	}()
	start := time.Now()
	for i := 0; ; i++ {
		if ready() {
			return nil
		}
		if pl.poll() > 0 && ready() {
			return nil
		}
		if i%32 != 31 {
			continue
		}
		if time.Since(start) < spinFor {
			runtime.Gosched()
			continue
		}
		if err := pl.sleep(ctx, q, &token); err != nil {
			return err
		}
	}
}

// sleep waits once for something to happen.
func (pl *poller) sleep(ctx context.Context, q *Queue, token *bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := pl.rt.stop
	select {
	case <-stop:
		return ErrClosed
	default:
	}
	if pl.waitMu.TryLock() {
		*token = false
		err := pl.sleepOnCQ(ctx, q)
		pl.waitMu.Unlock()
		pl.passRole()
		return err
	}
	select {
	case <-q.notify:
	case <-pl.wake:
		*token = true
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return ErrClosed
	}
	return nil
}

// passRole lets one sleeping waiter take the completion-queue role.
func (pl *poller) passRole() {
	select {
	case pl.wake <- struct{}{}:
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

func (pl *poller) sleepOnCQ(ctx context.Context, q *Queue) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pl.role.Store(&roleHolder{q: q, cancel: cancel})
	defer pl.role.Store(nil)
	select {
	case <-q.notify: // finished while the role was being taken
		return nil
	default:
	}
	err := pl.cq.Wait(cctx)
	if err != nil && ctx.Err() == nil {
		return nil // woken by a dispatcher
	}
	return err
}

// kick wakes q's waiter, wherever it sleeps.
func (rt *Runtime) kick(q *Queue) {
	if len(q.notify) == 0 { // skip the channel's lock when a wake-up is pending
		select {
		case q.notify <- struct{}{}:
		default:
		}
	}
	for _, pl := range [...]*poller{rt.sends, rt.recvs} {
		if r := pl.role.Load(); r != nil && r.q == q {
			r.cancel()
		}
	}
}
