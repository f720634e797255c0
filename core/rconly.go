package core

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

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
				return fmt.Errorf("core: RC to node %d: %w", p.node, krcore.ErrClosed)
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
	peers, hs := rt.holders(p)
	victim, ok := makeRoom(hs, rt.cfg.RCPeers)
	if !ok {
		return fmt.Errorf("%d peers hold RC QPs (RCPeers %d), none idle: %w", len(hs), rt.cfg.RCPeers, krcore.ErrNoQP)
	}
	if victim >= 0 {
		rt.evictPeer(peers[victim])
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

// holders samples the peers holding (or reserving) RC QPs for makeRoom,
// self being the peer that needs a place; poolMu held.
func (rt *Runtime) holders(self *peer) ([]*peer, []holder) {
	rt.flushOps()
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	var peers []*peer
	var hs []holder
	for _, p := range rt.peers {
		rcs := p.rcs()
		if !p.reserved && len(rcs) == 0 {
			continue
		}
		p.mu.Lock()
		idle, ops := p.idle, p.ops.Load()-p.lastOps
		p.mu.Unlock()
		peers = append(peers, p)
		hs = append(hs, holder{node: p.node, self: p == self, reserved: p.reserved, busy: !allIdle(rcs),
			built: builtRCs(rcs) > 0, idle: idle, ops: ops})
	}
	return peers, hs
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
	repost = p.shut(repost)
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

// reconnect gets a VQ whose peer lost its route (in RC-only mode its RC
// QPs, evicted while the VQ was idle) a new one in the background, then
// posts the requests it held; if none can be had they fail.
func (q *Queue) reconnect() {
	if q.reconnecting {
		return
	}
	q.reconnecting = true
	p, rt := q.peer, q.rt
	rt.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
		err := rt.routes.connect(ctx, p)
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
	q.flushLocked(q.held)
	q.held = nil
}
