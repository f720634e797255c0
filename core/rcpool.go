package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// newRC creates an RC QP that receives through the shared SRQ.
func (rt *Runtime) newRC() (verbs.QP, error) {
	return rt.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: rt.sends.cq, RecvCQ: rt.recvs.cq, SRQ: rt.srq,
		Cap: verbs.QPCap{MaxSendWR: rt.cfg.Depth, MaxSendSGE: 2}})
}

// Replies to an RC request: status byte, then (ok) the acceptor's endpoint.
const (
	rcOK     = 0
	rcFailed = 1
	rcNoQP   = 2 // the acceptor's pool is full and every RC of it busy
)

// buildRC connects an RC QP to a peer and makes it the peer's route: with
// DC, in the background for a hot peer, its VQs moving over as their DC
// requests drain; in RC-only mode, for Connect (see ensureRC).
func (rt *Runtime) buildRC(ctx context.Context, p *peer) error {
	qp, err := rt.newRC()
	if err != nil {
		return err
	}
	ep, _ := qp.Endpoint().MarshalBinary()
	resp, err := rt.ctrl.call(ctx, p.node, ctlRCReq, ep)
	switch {
	case err != nil:
	case len(resp) > 0 && resp[0] == rcNoQP:
		err = fmt.Errorf("%w: %w", errRCRefused, krcore.ErrNoQP)
	case len(resp) == 0 || resp[0] != rcOK:
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
	pq, err := rt.adoptRC(p, qp, remote.QPN, true)
	if err != nil {
		return err
	}
	// Both ends are ready now; the peer may route over its end too. The
	// peer answered the request just now, so the call skips the death
	// mark call checks: a mark set meanwhile (a request of ours timed out
	// on a loaded node) is cleared by its probe within milliseconds, but
	// a ready refused for it would keep the peer's end out of its pool
	// for as long as this end lives.
	if resp, err := rt.ctrl.callPeer(ctx, p, ctlRCReady, qpnPair(qp.Num(), remote.QPN)); err != nil || len(resp) == 0 || resp[0] != 0 {
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
func (rt *Runtime) adoptRC(p *peer, qp verbs.QP, remoteQPN uint32, built bool) (*pqp, error) {
	pq, err := newPQP(rt, qp, rt.cfg.Depth, p)
	if err != nil {
		qp.Close()
		return nil, err
	}
	// The control call that set it up reached the peer's current life
	// (a caller's record is refetched when its control QP is not the one
	// cached: see heardFrom).
	pq.remoteQPN, pq.built, pq.tgt = remoteQPN, built, p.target()
	rt.addPQP(pq)
	rt.count(&rt.stats.rcBuilt)
	return pq, nil
}

// acceptRC is the passive side of buildRC: create, connect, answer with our
// endpoint. The QP joins our pool when the caller says its end is ready
// (readyRC): before that, our requests on it would be dropped. A retried
// request (same caller QP) is answered with the QP already made. In
// RC-only mode the peer must fit our budget too (the strategy's admit).
func (rt *Runtime) acceptRC(ctx context.Context, from krcore.NodeID, body []byte) []byte {
	var remote verbs.Endpoint
	if err := remote.UnmarshalBinary(body); err != nil {
		return []byte{rcFailed}
	}
	if pq := rt.rcTo(from, remote.QPN); pq != nil {
		return acceptReply(pq.qp)
	}
	p, err := rt.peerFor(ctx, from)
	if err != nil {
		return []byte{rcFailed}
	}
	if err := rt.routes.admit(p); err != nil {
		rt.log.Warn("refused an RC connection", "peer", from, "err", err)
		return []byte{rcNoQP}
	}
	qp, err := rt.newRC()
	if err == nil {
		if err = verbs.Connect(qp, remote, rt.cfg.Path); err != nil {
			qp.Close()
		}
	}
	if err == nil {
		_, err = rt.adoptRC(p, qp, remote.QPN, false)
	}
	if err != nil {
		rt.unreserve(p)
		return []byte{rcFailed}
	}
	return acceptReply(qp)
}

func acceptReply(qp verbs.QP) []byte {
	ep, _ := qp.Endpoint().MarshalBinary()
	return append([]byte{rcOK}, ep...)
}

// rcTo finds our RC QP connected to node's QP qpn.
func (rt *Runtime) rcTo(node krcore.NodeID, qpn uint32) *pqp {
	for _, pq := range *rt.byQPN.Load() {
		if pq.rc != nil && pq.rc.node == node && pq.remoteQPN == qpn {
			return pq
		}
	}
	return nil
}

// readyRC puts an accepted RC QP into the caller's peer pool.
func (rt *Runtime) readyRC(from krcore.NodeID, body []byte) []byte {
	pq := rt.rcByPair(from, body)
	if pq == nil {
		return []byte{rcFailed}
	}
	pq.rc.addRC(pq)
	rt.unreserve(pq.rc)
	return []byte{rcOK}
}

// rcByPair finds our RC QP named in a control body (sender's QPN, ours).
func (rt *Runtime) rcByPair(from krcore.NodeID, body []byte) *pqp {
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
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	rt.retireRC(ctx, pq)
}

// retireRC closes an RC QP already out of service: it drains, tells the
// peer, and closes once the peer's end has drained too.
func (rt *Runtime) retireRC(ctx context.Context, pq *pqp) {
	if !pq.drain(rt.stop) {
		return // the runtime is closing; teardown destroys the QP
	}
	if err := rt.tellClosed(ctx, pq); err != nil {
		// A call to a silent peer confirms its death before it fails
		// (with the silence, not ErrPeerDead): its end is gone with it.
		// A live peer not told keeps its end, and tells this one when it
		// evicts it (closeRC).
		if errors.Is(err, krcore.ErrPeerDead) || pq.rc.deadErr() != nil {
			pq.closeEnd(false)
		} else {
			rt.log.Warn("peer not told of RC close", "peer", pq.rc.node, "err", err)
		}
	}
	pq.closeEnd(true)
}

// tellClosed tells pq's peer that this end has drained. A call that its
// deadline ended unanswered before it had tried often enough to call the
// peer silent (on a loaded node the caller may not run for most of the
// deadline) has the peer pinged on a context of its own, as a call out of
// attempts has: a silent peer taken for a live one not told would leave
// the QP closing for good, waiting for a close its other end never sends.
func (rt *Runtime) tellClosed(ctx context.Context, pq *pqp) error {
	_, err := rt.ctrl.call(ctx, pq.rc.node, ctlRCClose, qpnPair(pq.qp.Num(), pq.remoteQPN))
	if errors.Is(err, context.DeadlineExceeded) && !peerSilent(err) {
		rt.confirmDead(pq.rc, err)
	}
	return err
}

// closeRC is the passive side of evictRC: the peer has drained its end.
func (rt *Runtime) closeRC(from krcore.NodeID, body []byte) []byte {
	pq := rt.rcByPair(from, body)
	if pq == nil {
		return []byte{rcFailed}
	}
	pq.closeEnd(false)
	rt.background(func() { rt.evictRC(pq) }) // a no-op if we started it
	return []byte{rcOK}
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
