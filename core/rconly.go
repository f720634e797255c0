package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// ErrNoQP: in RC-only mode, a peer needs an RC QP, the pool holds RCPeers
// peers already and every one of them has requests in flight, so none can
// be evicted to make room.
var ErrNoQP = errors.New("core: no RC QP available: the pool is full and every RC peer is busy")

// ensureRC gives p an RC QP if it has none: in RC-only mode every VQ to a
// peer travels on one. One goroutine builds while the others wait for it;
// with an RC already pooled it costs one atomic load (a warm connect).
func (rt *Runtime) ensureRC(ctx context.Context, p *peer) error {
	for len(p.rcs()) == 0 {
		p.mu.Lock()
		if ch := p.pending; ch != nil {
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("core: RC to node %d: %w", p.node, ctx.Err())
			case <-rt.stop:
				return fmt.Errorf("core: RC to node %d: %w", p.node, ErrClosed)
			}
		}
		ch := make(chan struct{})
		p.pending = ch
		p.mu.Unlock()
		err := rt.connectRC(ctx, p)
		p.mu.Lock()
		p.pending = nil
		p.mu.Unlock()
		close(ch)
		if err != nil {
			return err
		}
	}
	return nil
}

// connectRC builds p's first RC QP within the budget.
func (rt *Runtime) connectRC(ctx context.Context, p *peer) error {
	if err := rt.reserve(p); err != nil {
		return fmt.Errorf("core: RC to node %d: %w", p.node, err)
	}
	err := rt.buildRC(ctx, p)
	rt.unreserve(p)
	return err
}

// reserve counts p toward RCPeers before its first RC QP is pooled. With
// the pool full it evicts the coldest peer whose RC QPs are idle; if every
// holder is busy it fails with ErrNoQP.
func (rt *Runtime) reserve(p *peer) error {
	rt.poolMu.Lock()
	defer rt.poolMu.Unlock()
	if p.reserved || len(p.rcs()) > 0 {
		p.reserved = true
		return nil
	}
	holders, victim := rt.poolScan(p)
	if holders >= rt.cfg.RCPeers {
		if victim == nil {
			return fmt.Errorf("%d peers hold RC QPs (RCPeers %d), none idle: %w", holders, rt.cfg.RCPeers, ErrNoQP)
		}
		rt.evictPeer(victim)
	}
	p.reserved = true
	return nil
}

// unreserve ends p's reservation: its RC QPs, if any, count from now on.
func (rt *Runtime) unreserve(p *peer) {
	rt.poolMu.Lock()
	p.reserved = false
	rt.poolMu.Unlock()
}

// poolScan counts the peers holding (or reserving) RC QPs and picks the
// coldest one other than self whose RC QPs are idle: one holding an RC QP
// this node built before one holding only QPs it accepted (whose builder's
// requests, one-sided, this node never sees: it may keep them hot), then
// most idle windows, then fewest requests since the last window. poolMu
// held.
func (rt *Runtime) poolScan(self *peer) (holders int, victim *peer) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	var vIdle int
	var vOps uint64
	vBuilt := false
	for _, p := range rt.peers {
		rcs := p.rcs()
		if !p.reserved && len(rcs) == 0 {
			continue
		}
		holders++
		if p == self || p.reserved || !allIdle(rcs) {
			continue
		}
		p.mu.Lock()
		idle, ops := p.idle, p.ops.Load()-p.lastOps
		p.mu.Unlock()
		built := builtRCs(rcs) > 0
		colder := idle > vIdle || idle == vIdle && ops < vOps
		if victim == nil || built && !vBuilt || built == vBuilt && colder {
			victim, vIdle, vOps, vBuilt = p, idle, ops, built
		}
	}
	return holders, victim
}

func allIdle(l []*pqp) bool {
	for _, pq := range l {
		if !pq.idle() {
			return false
		}
	}
	return true
}

// idle reports that nothing is in flight or waiting on the QP.
func (pq *pqp) idle() bool {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	return pq.n == 0 && len(pq.backlog) == 0 && !pq.broken
}

// evictPeer takes a peer's RC QPs out of the pool at once (so the budget
// frees now) and closes them in the background. Its VQs get a new RC QP
// when they next push. poolMu held.
func (rt *Runtime) evictPeer(p *peer) {
	for _, pq := range p.rcs() {
		if p.dropRC(pq) {
			rt.count(&rt.stats.rcEvicted)
			rt.background(func() {
				ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
				defer cancel()
				rt.retireRC(ctx, pq)
			})
		}
	}
	rt.log.Debug("evicted an idle RC peer for room", "peer", p.node)
}

// closeRCs takes p's RC QPs out of service and closes them, both ends,
// before it returns (Forget in RC-only mode).
func (rt *Runtime) closeRCs(ctx context.Context, p *peer) error {
	for _, pq := range p.rcs() {
		if p.dropRC(pq) {
			rt.count(&rt.stats.rcEvicted)
			rt.retireRC(ctx, pq)
		}
	}
	return ctx.Err()
}

// replaceRC repairs a broken RC QP in RC-only mode, where VQs have no DC to
// fall back on: the QP leaves the pool, a new one is built to the same peer
// and the requests the error caught (other than the culprit's) are reposted
// on it in their order, followed by those that queued meanwhile. The peer
// is told to close its end.
func (rt *Runtime) replaceRC(p *pqp, repost []rec) {
	peer := p.rc
	peer.dropRC(p)
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	var err error
	// Requests keep queuing on the broken QP until it is marked dead (after
	// that, VQs hold them and reconnect themselves): build before, and
	// again after if the first look saw nothing to repost.
	if len(repost) > 0 || p.backlogLen() > 0 {
		err = rt.ensureRC(ctx, peer)
	}
	p.mu.Lock()
	repost = append(repost, p.backlog...)
	p.backlog = nil
	p.dead = true
	p.mu.Unlock()
	if err == nil && len(repost) > 0 {
		err = rt.ensureRC(ctx, peer)
	}
	for _, r := range repost {
		to := peer.routeFor(r.q)
		if err != nil || to == nil {
			rt.failRecs([]rec{r}, verbs.WRFlushErr)
			continue
		}
		rt.failRecs(to.post([]rec{r}), verbs.WRFlushErr)
	}
	if err != nil {
		rt.log.Warn("no new RC QP to repost on", "peer", peer.node, "requests", len(repost), "err", err)
	}
	pair := qpnPair(p.qp.Num(), p.remoteQPN)
	p.destroy()
	rt.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
		defer cancel()
		rt.ctrl.call(ctx, peer.node, ctlRCClose, pair) // best effort: its end errs out by itself
	})
}

func (pq *pqp) backlogLen() int {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	return len(pq.backlog)
}

// reconnect gets a VQ whose peer lost its RC QPs (evicted while the VQ was
// idle) a new one in the background, then posts the requests it held; if
// none can be had they fail.
func (q *Queue) reconnect() {
	if q.reconnecting {
		return
	}
	q.reconnecting = true
	p, rt := q.peer, q.rt
	rt.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
		err := rt.ensureRC(ctx, p)
		cancel()
		q.mu.Lock()
		defer q.mu.Unlock()
		q.reconnecting = false
		if err != nil {
			rt.log.Warn("VQ lost its RC QP and got no new one", "peer", p.node, "err", err)
			q.failHeld()
			return
		}
		if q.inflight == 0 {
			q.postLocked(nil)
		}
	})
}

// failHeld fails the requests waiting for a route; q.mu held.
func (q *Queue) failHeld() {
	for _, r := range q.held {
		q.credits++
		q.finishLocked(r.seq, verbs.WRFlushErr, 0)
	}
	q.held = nil
}
