// Package vqrun drives krcore VQs for krbench the way package rawqp drives
// raw QPs, so the two measured side by side wait alike: Poll (a bounded
// spin, then the runtime's own wait), request loops (Latency: one at a
// time; Stream: a window in flight), and the two-sided Echo and Ping over
// bound ports. A rawqp.Deadline bounds every wait, as it does the raw QPs',
// without arming a timer inside a measured operation.
package vqrun

import (
	"context"
	"runtime"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
)

// Poll waits for a VQ's completions or messages the way rawqp.Poller
// waits for a CQ's, so a VQ and a raw QP measured side by side wait alike:
// poll for Spin (yielding now and then when Yield is set, as in one
// process), then the runtime's own wait (which spins briefly itself, then
// sleeps on its completion queue).
type Poll struct {
	Spin  time.Duration
	Yield bool
}

// pollThen is Poll's loop for Pop/PopWait and PopMsgs/PopMsgsWait.
func pollThen[T any](w Poll, ctx context.Context, out []T, poll func([]T) int, wait func(context.Context, []T) (int, error)) (int, error) {
	if w.Spin <= 0 {
		// The runtime's wait polls once before it sleeps, as
		// rawqp.Poller polls once before CQ.Wait: a poll here as well
		// would be one more than the raw QP's (on the soft RNIC's shm
		// link an empty poll hands the link back to its reader, a
		// futex wake).
		return wait(ctx, out)
	}
	if n := poll(out); n > 0 {
		return n, nil
	}
	start := time.Now()
	for i := 1; ; i++ {
		if n := poll(out); n > 0 {
			return n, nil
		}
		if i%rawqp.SpinYield != 0 {
			continue
		}
		if w.Yield {
			runtime.Gosched()
		}
		if time.Since(start) >= w.Spin {
			break
		}
	}
	return wait(ctx, out)
}

// Pop waits for q's completions into out.
func (w Poll) Pop(ctx context.Context, q krcore.VQ, out []krcore.Completion) (int, error) {
	return pollThen(w, ctx, out, q.Pop, q.PopWait)
}

// PopMsgs waits for q's messages into out.
func (w Poll) PopMsgs(ctx context.Context, q krcore.VQ, out []krcore.Message) (int, error) {
	return pollThen(w, ctx, out, q.PopMsgs, q.PopMsgsWait)
}

// String says how Poll waits, for a table's info.
func (w Poll) String() string {
	if w.Spin == 0 {
		return "the runtime's PopWait (it spins ~20us itself, then sleeps on its CQ)"
	}
	return "Pop for " + perf.DurationText(w.Spin) + ", then the runtime's PopWait"
}
