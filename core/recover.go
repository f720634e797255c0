package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// goRecover runs recovery of a broken physical QP in a goroutine the
// runtime owns; after Close the records simply fail.
func (rt *Runtime) goRecover(p *pqp, culprit rec, st verbs.Status, rest []rec) {
	select {
	case <-rt.stop:
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			rt.failRecs(append([]rec{culprit}, rest...), verbs.WRFlushErr)
		}()
		return
	default:
	}
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		rt.recover(p, culprit, st, rest)
	}()
}

// recover decides the fate of the requests a QP error caught and repairs
// the QP. Only the culprit's VQ sees an error: the culprit completes with
// the error status and that VQ's requests behind it with WR_FLUSH_ERR (as
// on a private QP), while every other VQ's requests are reposted in their
// order, so they never notice. Two cases are not the culprit's fault: a
// request that went to a former life of its peer (the node restarted under
// the same id: its DC target refused the request or its RC QP's other end
// is gone, so the request timed out) is reposted to the refetched target;
// and a peer that stopped answering fails every request to it at once
// rather than one retry timeout at a time. The strategy's triage and
// sentence decide; recover does the refetch, judgement and repair they
// call for.
func (rt *Runtime) recover(p *pqp, culprit rec, st verbs.Status, rest []rec) {
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	rt.log.Debug("recovering physical QP", "qpn", p.qp.Num(), "rc", p.rc != nil, "status", st, "requests", 1+len(rest))
	v := rt.routes.triage(st, p.rc != nil)
	pr := culprit.target.peer
	var err error
	if v.refetches() {
		// Before the peer is taken for dead: a node that restarted under
		// the same id is alive, and its former life never answers.
		_, err = pr.refresh(ctx)
		rt.log.Debug("refetched target", "peer", pr.node, "err", err)
	}
	blamed := v.blames(pr.target() != p.sentTo(culprit), err)
	var deadPeer *peer
	if v.timedOut() && blamed {
		rt.meta.Invalidate(pr.node)
		if rt.deadAfterTimeout(pr, fmt.Errorf("request %s on QP %d", st, p.qp.Num()), err) && v.dead {
			deadPeer = pr
		}
	}
	fin, repost := sentence(culprit, rest, st, blamed, deadPeer)
	for i := range repost {
		repost[i].target = repost[i].target.peer.target() // refetched, maybe
	}
	rt.repair(p, repost)
	for _, f := range fin {
		f.q.finish(f.seq, f.status, 0)
	}
}

// deadAfterTimeout reports whether pr, whose request timed out (cause)
// and whose record was refetched then (refetchErr), is dead: known so
// already, gone from the MetaServer (it left, or its lease lapsed), or
// found so by judge. A timeout alone does not make it dead, as this
// runtime may not have run for the transport's timeout; judge tells,
// within a few probeTimeouts, what building a new RC QP would tell only
// after a control call's retries.
func (rt *Runtime) deadAfterTimeout(pr *peer, cause, refetchErr error) bool {
	if errors.Is(refetchErr, meta.ErrNotFound) {
		rt.markDead(pr, fmt.Errorf("%w, then %w", cause, refetchErr))
		return true
	}
	return rt.confirmDead(pr, cause)
}

// repair brings a DCI back (RESET, then ready again: DC needs no peer for
// that) and reposts; a broken RC QP is the strategy's to repair: dropped
// and its requests moved to their VQs' DCIs, or in RC-only mode to a new
// RC QP (replaceRC).
func (rt *Runtime) repair(p *pqp, repost []rec) {
	if p.rc != nil {
		rt.routes.repairRC(p, repost)
		return
	}
	err := p.qp.Modify(verbs.QPAttr{State: verbs.StateReset})
	if err == nil {
		// A new starting PSN, as on hardware: responses to the DCI's
		// previous life may still arrive, and must not match new requests.
		p.sqPSN = newPSN(p.sqPSN)
		err = verbs.ReadyAt(p.qp, rt.cfg.Path, p.sqPSN)
	}
	p.mu.Lock()
	if err != nil {
		rt.log.Error("DCI recovery failed", "qpn", p.qp.Num(), "err", err)
		p.dead = true
	}
	p.backlog = append(repost, p.backlog...)
	p.broken = false
	lost := p.drainLocked()
	p.mu.Unlock()
	rt.failRecs(lost, verbs.WRFlushErr)
}

// shut marks a broken QP dead, so nothing more queues on it, and returns
// rs followed by what had queued on it meanwhile, for reposting elsewhere.
func (p *pqp) shut(rs []rec) []rec {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs = append(rs, p.backlog...)
	p.backlog = nil
	p.dead = true
	return rs
}

// retryTimeout bounds recovery's own remote work (a MetaServer READ).
func (rt *Runtime) retryTimeout() time.Duration {
	if t := rt.cfg.Path.Timeout; t > 0 {
		return 8 * t
	}
	return 2 * time.Second
}

// destroy releases a physical QP for good. Anything still on it fails
// with WR_FLUSH_ERR (only at teardown does anything remain).
func (p *pqp) destroy() {
	p.mu.Lock()
	if p.destroyed {
		p.mu.Unlock()
		return
	}
	p.dead, p.destroyed = true, true
	lost := p.backlog
	p.backlog = nil
	for ; p.n > 0; p.n-- {
		lost = append(lost, p.recs[p.slot(p.base)])
		p.recs[p.slot(p.base)] = rec{}
		p.base++
	}
	p.used = 0
	qp := p.qp
	p.mu.Unlock()
	p.rt.failRecs(lost, verbs.WRFlushErr)
	p.rt.removePQP(p)
	qp.Close()
	p.rt.Deregister(p.hdr)
}

// newPSN picks a random 24-bit starting PSN other than old.
func newPSN(old uint32) uint32 {
	for {
		if psn := uint32(nonce.Uint64()) & (1<<24 - 1); psn != old {
			return psn
		}
	}
}
