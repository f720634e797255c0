package racekv

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// VQ reaches a memory node through a krcore virtual queue: embedded or
// through krcored, whichever api is.
type VQ struct {
	api     krcore.API
	q       krcore.VQ
	region  krcore.Region
	scratch krcore.MR
	reqs    []krcore.Request
	comps   []krcore.Completion
}

// DialVQ connects a queue of api to node and learns the table region it
// exports under name (Node.Name). The three things it needs (the queue,
// connected; the region; a registered scratch buffer) do not depend on
// each other, so it asks for them at once: through krcored the queue and
// the region are one round trip (QueueTo), in which krcored asks the
// memory node for the region while it connects, and the scratch buffer
// another beside it. The region is looked up as no port (api.Region),
// which is what the queue, holding none bound, would ask as.
func DialVQ(ctx context.Context, api krcore.API, node krcore.NodeID, name string) (_ *VQ, err error) {
	v := &VQ{api: api, reqs: make([]krcore.Request, 0, maxBatch), comps: make([]krcore.Completion, maxBatch)}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	var wg sync.WaitGroup
	var qErr, rErr, mErr error
	if d, ok := api.(krcore.QueueDialer); ok {
		wg.Go(func() {
			if v.q, v.region, qErr = d.QueueTo(ctx, node, nil, name); qErr != nil {
				qErr = fmt.Errorf("racekv: queue to memory node %d, region %q: %w", node, name, qErr)
			}
		})
	} else {
		wg.Go(func() {
			if v.q, qErr = api.Queue(); qErr != nil {
				qErr = fmt.Errorf("racekv: queue: %w", qErr)
			} else if qErr = v.q.Connect(ctx, node, nil); qErr != nil {
				qErr = fmt.Errorf("racekv: connect to memory node %d: %w", node, qErr)
			}
		})
		wg.Go(func() {
			if v.region, rErr = api.Region(ctx, node, name); rErr != nil {
				rErr = fmt.Errorf("racekv: region %q of node %d: %w", name, node, rErr)
			}
		})
	}
	wg.Go(func() {
		if v.scratch, mErr = api.RegMR(scratchSize, verbs.AccessLocalWrite); mErr != nil {
			mErr = fmt.Errorf("racekv: register scratch: %w", mErr)
		}
	})
	wg.Wait()
	if err := errors.Join(qErr, rErr, mErr); err != nil {
		return nil, err
	}
	return v, nil
}

// Do posts ops on the queue and waits for their completions.
func (v *VQ) Do(ctx context.Context, ops ...*Op) error {
	if _, err := batchBytes(ops); err != nil {
		return err
	}
	buf, at := v.scratch.Bytes(), 0
	v.reqs = v.reqs[:0]
	for i, op := range ops {
		n := opLen(op)
		if op.Kind == verbs.OpWrite {
			copy(buf[at:], op.Buf)
		}
		v.reqs = append(v.reqs, krcore.Request{ID: uint64(i), Op: op.Kind, Local: v.scratch.Range(at, n),
			Remote: v.region.At(op.Off), Compare: op.Compare, Swap: op.Swap})
		at += n
	}
	if n, err := v.q.Push(ctx, true, v.reqs...); err != nil || n < len(v.reqs) {
		if err == nil {
			err = fmt.Errorf("racekv: the queue took %d of %d requests: %w", n, len(v.reqs), krcore.ErrNoCredit)
		}
		return v.drain(ctx, err)
	}
	var failed error
	for got := 0; got < len(ops); {
		n, err := v.q.PopWait(ctx, v.comps[:len(ops)-got])
		if err != nil {
			return err
		}
		for _, c := range v.comps[:n] {
			if err := c.Err(); err != nil && failed == nil {
				failed = err
			}
		}
		got += n
	}
	if failed != nil {
		return failed
	}
	unstage(ops, buf)
	return nil
}

// drain waits for what a failed Push accepted, so the queue is empty for
// the next Do, and returns err.
func (v *VQ) drain(ctx context.Context, err error) error {
	for v.q.Outstanding() > 0 {
		if _, werr := v.q.PopWait(ctx, v.comps); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return err
}

// Close releases the queue and the scratch buffer.
func (v *VQ) Close() error {
	var errs []error
	if v.q != nil {
		errs = append(errs, v.q.Close())
	}
	if v.scratch != nil {
		errs = append(errs, v.api.Deregister(v.scratch))
	}
	return errors.Join(errs...)
}
