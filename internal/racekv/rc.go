package racekv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/verbs"
)

// rcSpin is how many empty polls an RC client makes before it sleeps on
// its CQ: the machines this runs on have two cores to share.
const rcSpin = 200

// exchangeTimeout bounds one control message of the endpoint exchange (a
// variable so that a test can outlive it).
var exchangeTimeout = 10 * time.Second

// RC reaches a memory node through a raw RC queue pair the client created
// and connected itself: its own PD, CQ, QP and MR on its own device, the
// endpoints exchanged with the memory node over TCP (Node.ServeRC), as a
// verbs program does without krcore.
type RC struct {
	ep     *rawqp.Endpoint
	ctl    *control.Conn
	remote control.MR
	wrs    []verbs.SendWR
	sges   []verbs.SGE
	wc     []verbs.WC
}

// DialRC creates an RC QP on dev and connects it to the memory node whose
// ServeRC listens at addr, with path's attributes (the zero Path: the
// provider's ACK timeout and seven retries).
func DialRC(ctx context.Context, dev verbs.Device, addr string, path verbs.Path) (_ *RC, err error) {
	r := &RC{wrs: make([]verbs.SendWR, 0, maxBatch), sges: make([]verbs.SGE, maxBatch), wc: make([]verbs.WC, maxBatch)}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.ep, err = rawqp.NewEndpoint(dev, nil, scratchSize, rawqp.Shape{SendDepth: maxBatch, RecvDepth: 1}); err != nil {
		return nil, fmt.Errorf("racekv: RC endpoint: %w", err)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("racekv: dial memory node %s: %w", addr, err)
	}
	r.ctl = control.NewConn(context.Background(), conn)
	ep, err := control.MarshalEP(r.ep.QP)
	if err != nil {
		return nil, err
	}
	rep, err := r.ctl.Call(&control.Msg{Op: control.OpConnCreate, EP: ep}, timeoutOf(ctx))
	if err != nil {
		return nil, fmt.Errorf("racekv: endpoint exchange with %s: %w", addr, err)
	}
	remote, err := control.UnmarshalEP(rep.EP)
	if err != nil {
		return nil, err
	}
	if rep.MR == nil {
		return nil, fmt.Errorf("racekv: memory node %s sent no region: %w", addr, ErrFormat)
	}
	r.remote = *rep.MR
	if err := verbs.Connect(r.ep.QP, remote, path); err != nil {
		return nil, fmt.Errorf("racekv: connect RC QP to %s: %w", addr, err)
	}
	return r, nil
}

// timeoutOf is what is left of ctx, or exchangeTimeout.
func timeoutOf(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return exchangeTimeout
}

// Do posts ops on the QP, signaled, and waits for their completions: a
// short spin on the CQ, then a blocking wait.
func (r *RC) Do(ctx context.Context, ops ...*Op) error {
	if _, err := batchBytes(ops); err != nil {
		return err
	}
	buf, at := r.ep.MR.Bytes(), 0
	r.wrs = r.wrs[:0]
	for i, op := range ops {
		n := opLen(op)
		if op.Kind == verbs.OpWrite {
			copy(buf[at:], op.Buf)
		}
		if op.Off > uint64(r.remote.Len) {
			return fmt.Errorf("racekv: %s at %d beyond the %d B region: %w", op.Kind, op.Off, r.remote.Len, verbs.ErrInvalid)
		}
		r.sges[i] = verbs.SGEOf(r.ep.MR, at, n)
		r.wrs = append(r.wrs, verbs.SendWR{ID: uint64(i), Op: op.Kind, Flags: verbs.Signaled, SGL: r.sges[i : i+1],
			RemoteAddr: r.remote.Addr + op.Off, RKey: r.remote.RKey, CompareAdd: op.Compare, Swap: op.Swap})
		at += n
	}
	posted, err := r.ep.QP.PostSend(r.wrs)
	if err != nil {
		err = fmt.Errorf("racekv: post %s: %w", ops[posted].Kind, err)
	}
	var failed error
	for got, spins := 0, 0; got < posted; {
		n, perr := r.ep.CQ.Poll(r.wc)
		if perr != nil {
			return errors.Join(err, fmt.Errorf("racekv: poll CQ: %w", perr))
		}
		for _, wc := range r.wc[:n] {
			if werr := rawqp.CheckWC(&wc, "racekv: "+ops[wc.ID].Kind.String()); werr != nil && failed == nil {
				failed = werr
			}
		}
		got += n
		if n > 0 || got == posted {
			continue
		}
		if spins++; spins < rcSpin {
			continue
		}
		if werr := r.ep.CQ.Wait(ctx); werr != nil {
			return errors.Join(err, fmt.Errorf("racekv: wait for completions: %w", werr))
		}
	}
	if err = errors.Join(err, failed); err != nil {
		return err
	}
	unstage(ops, buf)
	return nil
}

// Close destroys the QP and its resources and hangs up, which frees the
// memory node's side.
func (r *RC) Close() error {
	var errs []error
	if r.ctl != nil {
		errs = append(errs, r.ctl.Close())
	}
	if r.ep != nil {
		errs = append(errs, r.ep.Close())
	}
	return errors.Join(errs...)
}
