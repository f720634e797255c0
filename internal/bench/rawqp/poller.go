package rawqp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/krcore/krcore/verbs"
)

// Poller waits for completions: it busy-polls for a bounded time, because a
// blocking wait costs a goroutine wake-up (several microseconds) that would
// swamp an in-memory READ, then blocks on the CQ with a deadline, because
// these machines have two cores to share and a dead peer must not hang us.
//
// While spinning in one process it yields now and then (see Next). Across
// processes it does not: there the yields kept waking the runtime's idle
// thread and left the fabric's link reader and the peer process one core,
// and READ latency rose to about the spin budget (krbench -spin 200us:
// 130-230 us instead of 40-60 us without yields).
type Poller struct {
	ctx     context.Context
	cq      verbs.CQ
	wc      []verbs.WC
	spin    time.Duration
	yield   bool
	timeout time.Duration

	// wait hands out the context blocking waits use: a fresh deadline per
	// wait would arm and stop a timer inside every measured operation. A
	// wait thus gives up after between timeout/2 and timeout.
	wait *Deadline
}

// NewPoller waits on cq: it polls for spin, yielding to the scheduler now
// and then if yield is set (both sides in one process), then blocks with
// deadlines timeout apart, under ctx.
func NewPoller(ctx context.Context, cq verbs.CQ, spin, timeout time.Duration, yield bool) *Poller {
	return &Poller{ctx: ctx, cq: cq, wc: make([]verbs.WC, 64), spin: spin, timeout: timeout, yield: yield,
		wait: NewDeadline(ctx, timeout)}
}

// SetCQ points the poller at another CQ (the connect test's next
// connection).
func (p *Poller) SetCQ(cq verbs.CQ) { p.cq = cq }

// Close releases the Poller's wait context.
func (p *Poller) Close() { p.wait.Close() }

// Next returns one or more completions.
func (p *Poller) Next() ([]verbs.WC, error) {
	if n, err := p.cq.Poll(p.wc); n > 0 || err != nil {
		return p.result(n, err)
	}
	if p.spin > 0 {
		start := time.Now()
		for i := 1; ; i++ {
			if n, err := p.cq.Poll(p.wc); n > 0 || err != nil {
				return p.result(n, err)
			}
			if i%SpinYield != 0 {
				continue
			}
			if p.yield {
				// A goroutine we woke (the in-process peer our last post
				// completed a receive for) sits in this P's runnext slot;
				// without a yield it would wait out our whole spin. Seen
				// as in-process SEND ping-pong latency equal to -spin.
				runtime.Gosched()
			}
			// Reading the clock costs more than a poll; look now.
			if time.Since(start) >= p.spin {
				break
			}
		}
	}
	ctx, deadline := p.wait.Get(), p.wait.At()
	for {
		werr := p.cq.Wait(ctx)
		if n, err := p.cq.Poll(p.wc); n > 0 || err != nil {
			return p.result(n, err)
		}
		switch {
		case p.ctx.Err() != nil:
			return nil, fmt.Errorf("wait for completion: %w", p.ctx.Err())
		case !time.Now().Before(deadline):
			return nil, fmt.Errorf("nothing for at least %v: %w", p.timeout/2, ErrNoCompletion)
		case werr != nil && !errors.Is(werr, context.DeadlineExceeded):
			return nil, fmt.Errorf("wait for completion: %w", werr)
		}
	}
}

func (p *Poller) result(n int, err error) ([]verbs.WC, error) {
	if err != nil {
		return nil, fmt.Errorf("poll CQ: %w", err)
	}
	return p.wc[:n], nil
}

// CheckWC turns a failed completion into an error naming the operation.
func CheckWC(wc *verbs.WC, what string) error {
	if wc.Status != verbs.Success {
		return fmt.Errorf("%s: %w", what, wc.Err())
	}
	return nil
}
