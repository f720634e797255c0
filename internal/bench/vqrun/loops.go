package vqrun

import (
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
)

// Latency runs warmup+iters requests one at a time and returns the last
// iters push-to-completion times. It pushes with PushOne, which takes the
// request by value: Push(ctx, wait, req) through the krcore.VQ interface
// builds its variadic slice on the heap per call.
func Latency(dl *rawqp.Deadline, q krcore.VQ, poll Poll, req krcore.Request, warmup, iters int) ([]time.Duration, error) {
	out := make([]krcore.Completion, 1)
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		req.ID = uint64(i)
		ctx := dl.Get()
		t0 := time.Now()
		if err := q.PushOne(ctx, false, req); err != nil {
			return nil, fmt.Errorf("VQ %s %d B #%d: %w", req.Op, req.Local.Len, i, err)
		}
		n, err := poll.Pop(ctx, q, out)
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("VQ %s %d B #%d: %w", req.Op, req.Local.Len, i, err)
		}
		if n != 1 || out[0].ID != uint64(i) {
			return nil, fmt.Errorf("VQ %s #%d: got %d completions (first ID %d)", req.Op, i, n, out[0].ID)
		}
		if err := out[0].Err(); err != nil {
			return nil, err
		}
		if i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// Stream keeps up to depth requests in flight on q until total have
// completed, asking for a completion on one in cqMod (and the last); a VQ
// completes in order, so a completion retires every request before it.
func Stream(dl *rawqp.Deadline, q krcore.VQ, poll Poll, req krcore.Request, total, depth, cqMod int) ([]perf.Mark, error) {
	reqs := make([]krcore.Request, depth)
	out := make([]krcore.Completion, 64)
	marks := make([]perf.Mark, 1, total/cqMod+2)
	posted, done := 0, 0
	start := time.Now()
	for done < total {
		ctx := dl.Get()
		if room := min(depth-(posted-done), total-posted); room > 0 {
			batch := reqs[:room]
			for k := range batch {
				seq := posted + k
				batch[k] = req
				batch[k].ID = uint64(seq)
				batch[k].Unsignaled = !((seq+1)%cqMod == 0 || seq+1 == total)
			}
			n, err := q.Push(ctx, true, batch...)
			posted += n
			if err != nil {
				return nil, fmt.Errorf("VQ push %s #%d (%d in flight): %w", req.Op, posted, posted-done, err)
			}
		}
		n, err := poll.Pop(ctx, q, out)
		if err != nil {
			return nil, fmt.Errorf("VQ %s after %d of %d: %w", req.Op, done, total, err)
		}
		for k := range out[:n] {
			cp := &out[k]
			if err := cp.Err(); err != nil {
				return nil, err
			}
			if int(cp.ID) < done || int(cp.ID) >= posted {
				return nil, fmt.Errorf("VQ %s: completion for request %d out of order (done %d, posted %d)", req.Op, cp.ID, done, posted)
			}
			done = int(cp.ID) + 1
		}
		marks = append(marks, perf.Mark{At: time.Since(start), Msgs: done})
	}
	return marks, nil
}
