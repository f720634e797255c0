package bench

import (
	"context"
	"runtime"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/rawqp"
)

// vqPoll waits for a VQ's completions or messages the way krbench's
// poller waits for a CQ's, so a VQ and a raw QP measured side by side wait
// alike: poll for spin (yielding now and then when yield is set, as in one
// process), then the runtime's own wait (which spins briefly itself, then
// sleeps on its completion queue).
type vqPoll struct {
	spin  time.Duration
	yield bool
}

func newVQPoll(cfg *config, placement string) vqPoll {
	return vqPoll{spin: cfg.spinFor(placement), yield: placement == placementInproc}
}

// pollThen is vqPoll's loop for Pop/PopWait and PopMsgs/PopMsgsWait.
func pollThen[T any](w vqPoll, ctx context.Context, out []T, poll func([]T) int, wait func(context.Context, []T) (int, error)) (int, error) {
	if n := poll(out); n > 0 {
		return n, nil
	}
	if w.spin > 0 {
		start := time.Now()
		for i := 1; ; i++ {
			if n := poll(out); n > 0 {
				return n, nil
			}
			if i%rawqp.SpinYield != 0 {
				continue
			}
			if w.yield {
				runtime.Gosched()
			}
			if time.Since(start) >= w.spin {
				break
			}
		}
	}
	return wait(ctx, out)
}

func (w vqPoll) pop(ctx context.Context, q krcore.VQ, out []krcore.Completion) (int, error) {
	return pollThen(w, ctx, out, q.Pop, q.PopWait)
}

func (w vqPoll) popMsgs(ctx context.Context, q krcore.VQ, out []krcore.Message) (int, error) {
	return pollThen(w, ctx, out, q.PopMsgs, q.PopMsgsWait)
}

func (w vqPoll) String() string {
	if w.spin == 0 {
		return "the runtime's PopWait (it spins ~20us itself, then sleeps on its CQ)"
	}
	return "Pop for " + durText(w.spin) + ", then the runtime's PopWait"
}

// deadline hands out a context whose deadline is at least timeout/2 away,
// making a new one only when the old one gets closer: every wait is
// bounded without arming a timer inside each measured operation.
type deadline struct {
	parent  context.Context
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	at      time.Time
}

func newDeadline(parent context.Context, timeout time.Duration) *deadline {
	return &deadline{parent: parent, timeout: timeout}
}

func (d *deadline) get() context.Context {
	now := time.Now()
	if d.ctx == nil || d.at.Sub(now) < d.timeout/2 {
		d.close()
		d.at = now.Add(d.timeout)
		d.ctx, d.cancel = context.WithDeadline(d.parent, d.at)
	}
	return d.ctx
}

func (d *deadline) close() {
	if d.cancel != nil {
		d.cancel()
		d.ctx, d.cancel = nil, nil
	}
}
