package core

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/krcore/krcore/verbs"
)

// newRC creates an RC QP that receives through the shared SRQ.
func (rt *Runtime) newRC() (verbs.QP, error) {
	return rt.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: rt.sends.cq, RecvCQ: rt.recvs.cq, SRQ: rt.srq,
		Cap: verbs.QPCap{MaxSendWR: rt.cfg.Depth, MaxSendSGE: 2}})
}

// buildRC connects an RC QP to a hot peer in the background and makes it
// the peer's route: its VQs move over as their DC requests drain.
func (rt *Runtime) buildRC(p *peer) error {
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	qp, err := rt.newRC()
	if err != nil {
		return err
	}
	ep, _ := qp.Endpoint().MarshalBinary()
	resp, err := rt.ctrl.call(ctx, p.node, ctlRCReq, ep)
	if err == nil && (len(resp) == 0 || resp[0] != 0) {
		err = errRCRefused
	}
	var remote verbs.Endpoint
	if err == nil {
		err = remote.UnmarshalBinary(resp[1:])
	}
	if err == nil {
		err = verbs.Connect(qp, remote, rt.cfg.Path)
	}
	if err != nil {
		qp.Close()
		return fmt.Errorf("core: RC to node %d: %w", p.node, err)
	}
	pq, err := rt.adoptRC(p, qp, remote.QPN)
	if err != nil {
		return err
	}
	// Both ends are ready now; the peer may route over its end too.
	if resp, err := rt.ctrl.call(ctx, p.node, ctlRCReady, qpnPair(qp.Num(), remote.QPN)); err != nil || len(resp) == 0 || resp[0] != 0 {
		rt.log.Warn("peer did not take the RC QP into its pool", "peer", p.node, "err", err)
	}
	p.addRC(pq)
	return nil
}

func qpnPair(mine, theirs uint32) []byte {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, mine), theirs)
}

// adoptRC wraps a connected RC QP so its completions dispatch; VQs use it
// once addRC puts it in the peer's pool.
func (rt *Runtime) adoptRC(p *peer, qp verbs.QP, remoteQPN uint32) (*pqp, error) {
	pq, err := newPQP(rt, qp, rt.cfg.Depth, p)
	if err != nil {
		qp.Close()
		return nil, err
	}
	pq.remoteQPN = remoteQPN
	rt.addPQP(pq)
	rt.count(&rt.stats.rcBuilt)
	return pq, nil
}

// acceptRC is the passive side of buildRC: create, connect, answer with our
// endpoint. The QP joins our pool when the caller says its end is ready
// (readyRC): before that, our requests on it would be dropped.
func (rt *Runtime) acceptRC(ctx context.Context, from NodeID, body []byte) []byte {
	var remote verbs.Endpoint
	if err := remote.UnmarshalBinary(body); err != nil {
		return []byte{1}
	}
	p, err := rt.peerFor(ctx, from)
	if err != nil {
		return []byte{1}
	}
	qp, err := rt.newRC()
	if err != nil {
		return []byte{1}
	}
	if err := verbs.Connect(qp, remote, rt.cfg.Path); err != nil {
		qp.Close()
		return []byte{1}
	}
	ep, _ := qp.Endpoint().MarshalBinary()
	if _, err := rt.adoptRC(p, qp, remote.QPN); err != nil {
		return []byte{1}
	}
	return append([]byte{0}, ep...)
}

// readyRC puts an accepted RC QP into the caller's peer pool.
func (rt *Runtime) readyRC(from NodeID, body []byte) []byte {
	pq := rt.rcByPair(from, body)
	if pq == nil {
		return []byte{1}
	}
	pq.rc.addRC(pq)
	return []byte{0}
}

// rcByPair finds our RC QP named in a control body (sender's QPN, ours).
func (rt *Runtime) rcByPair(from NodeID, body []byte) *pqp {
	if len(body) != 8 {
		return nil
	}
	pq := (*rt.byQPN.Load())[binary.LittleEndian.Uint32(body[4:])]
	if pq == nil || pq.rc == nil || pq.rc.node != from || pq.remoteQPN != binary.LittleEndian.Uint32(body) {
		return nil
	}
	return pq
}

// evictRC takes an RC QP out of service. Each end stops routing to it,
// drains its own requests, then tells the other end; an end closes its QP
// once both ends have drained, so no request ever reaches a closed QP.
func (rt *Runtime) evictRC(pq *pqp) {
	if !pq.rc.dropRC(pq) {
		return
	}
	rt.count(&rt.stats.rcEvicted)
	if !pq.drain(rt.stop) {
		return // the runtime is closing; teardown destroys the QP
	}
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	if _, err := rt.ctrl.call(ctx, pq.rc.node, ctlRCClose, qpnPair(pq.qp.Num(), pq.remoteQPN)); err != nil {
		rt.log.Warn("peer not told of RC close", "peer", pq.rc.node, "err", err)
	}
	pq.closeEnd(true)
}

// closeRC is the passive side of evictRC: the peer has drained its end.
func (rt *Runtime) closeRC(from NodeID, body []byte) []byte {
	pq := rt.rcByPair(from, body)
	if pq == nil {
		return []byte{1}
	}
	pq.closeEnd(false)
	rt.background(func() { rt.evictRC(pq) }) // a no-op if we started it
	return []byte{0}
}

// closeEnd records that one end (ours if local) has drained and destroys
// the QP once both have.
func (pq *pqp) closeEnd(local bool) {
	pq.mu.Lock()
	if local {
		pq.localDrained = true
	} else {
		pq.remoteDrained = true
	}
	both := pq.localDrained && pq.remoteDrained
	pq.mu.Unlock()
	if both {
		pq.destroy()
	}
}

// drain waits until no request is in flight or queued on the QP, or stop
// closes. The caller has stopped new requests from arriving; requests that
// never complete fail with RETRY_EXC_ERR, so this ends.
func (pq *pqp) drain(stop <-chan struct{}) bool {
	t := time.NewTicker(100 * time.Microsecond)
	defer t.Stop()
	for {
		pq.mu.Lock()
		idle := pq.n == 0 && len(pq.backlog) == 0
		pq.mu.Unlock()
		if idle {
			return true
		}
		pq.rt.sends.poll()
		select {
		case <-stop:
			return false
		case <-t.C:
		}
	}
}
