package core

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/krcore/krcore"
)

// manage runs the pool policy every HotWindow until the runtime stops.
func (rt *Runtime) manage() {
	defer rt.wg.Done()
	if rt.cfg.RCPeers < 0 {
		<-rt.stop
		return
	}
	pp := rt.routes.policy(rt.cfg)
	t := time.NewTicker(rt.cfg.HotWindow)
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		loads, byNode := rt.loads()
		build, evict := pp.plan(loads)
		for _, n := range evict {
			rt.evictIdleRCs(byNode[n], pp.coldWindows)
		}
		for _, n := range build {
			p := byNode[n]
			p.mu.Lock()
			busy := p.building
			p.building = true
			p.mu.Unlock()
			if busy {
				continue
			}
			rt.background(func() {
				ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
				defer cancel()
				if err := rt.buildRC(ctx, p); err != nil {
					rt.log.Warn("RC build failed; staying on DC", "peer", p.node, "err", err)
				}
				p.mu.Lock()
				p.building = false
				p.mu.Unlock()
			})
		}
	}
}

// loads samples every peer's requests since the last window.
func (rt *Runtime) loads() ([]peerLoad, map[krcore.NodeID]*peer) {
	rt.flushOps()
	rt.mu.Lock()
	peers := make([]*peer, 0, len(rt.peers))
	for _, p := range rt.peers {
		peers = append(peers, p)
	}
	rt.mu.Unlock()
	loads := make([]peerLoad, 0, len(peers))
	byNode := make(map[krcore.NodeID]*peer, len(peers))
	for _, p := range peers {
		ops := p.ops.Load()
		p.mu.Lock()
		d := ops - p.lastOps
		p.lastOps = ops
		if d == 0 {
			p.idle++
		} else {
			p.idle = 0
		}
		l := peerLoad{node: p.node, ops: d, rcs: len(p.rcs()), built: builtRCs(p.rcs()), idle: p.idle}
		p.mu.Unlock()
		loads = append(loads, l)
		byNode[p.node] = p
	}
	return loads, byNode
}

// flushOps adds to every peer's count the requests its QPs posted and
// have not added yet (see pqp.countOp), before the counts are sampled.
func (rt *Runtime) flushOps() {
	for _, pq := range *rt.byQPN.Load() {
		pq.flushOps()
	}
}

// untilStop returns a context that ends when the runtime stops, or when
// cancel is called (which also ends the goroutine watching for the stop):
// for the runtime's long-lived waiters, whose waits take a context.
func (rt *Runtime) untilStop() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-rt.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// background runs f in a goroutine the runtime owns, unless it is stopping.
func (rt *Runtime) background(f func()) {
	select {
	case <-rt.stop:
		return
	default:
	}
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		f()
	}()
}

// builtRCs counts the RC QPs of l that this node built.
func builtRCs(l []*pqp) int {
	n := 0
	for _, pq := range l {
		if pq.built {
			n++
		}
	}
	return n
}

// evictIdleRCs evicts, in the background, the RC QPs to p that this node
// built, each once its other end confirms it is idle too: the plan saw
// only this node's requests, and the peer may be sending its own over the
// same QP. The peer must have pushed nothing for as many windows as this
// node (up to coldWindows); a peer that does not answer is not using it
// (keepRC decides).
func (rt *Runtime) evictIdleRCs(p *peer, coldWindows int) {
	p.mu.Lock()
	busy, need := p.evicting, min(p.idle, coldWindows)
	p.evicting = true
	p.mu.Unlock()
	if busy {
		return
	}
	rt.background(func() {
		defer func() {
			p.mu.Lock()
			p.evicting = false
			p.mu.Unlock()
		}()
		for _, pq := range p.rcs() {
			if !pq.built {
				continue
			}
			if idle, err := rt.peerIdle(pq); keepRC(idle, err, need) {
				rt.log.Debug("RC QP kept: its other end uses it", "peer", p.node, "qpn", pq.qp.Num(), "peer idle windows", idle)
				continue
			}
			rt.evictRC(pq)
		}
	})
}

// peerIdle asks the other end of pq how many windows it has pushed nothing
// to this node and has nothing in flight on pq (0 if it has).
func (rt *Runtime) peerIdle(pq *pqp) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rt.retryTimeout())
	defer cancel()
	resp, err := rt.ctrl.call(ctx, pq.rc.node, ctlRCIdle, qpnPair(pq.qp.Num(), pq.remoteQPN))
	if err != nil {
		return 0, err
	}
	if len(resp) != 5 || resp[0] != rcOK {
		return 0, errRCRefused // it no longer has its end
	}
	return int(binary.LittleEndian.Uint32(resp[1:])), nil
}

// idleRC is the passive side of peerIdle: how many windows this node has
// pushed nothing to the caller, 0 while it has requests on the QP.
func (rt *Runtime) idleRC(from krcore.NodeID, body []byte) []byte {
	pq := rt.rcByPair(from, body)
	if pq == nil {
		return []byte{rcFailed}
	}
	idle := 0
	if pq.idle() {
		pq.rc.mu.Lock()
		idle = pq.rc.idle
		pq.rc.mu.Unlock()
	}
	return binary.LittleEndian.AppendUint32([]byte{rcOK}, uint32(idle))
}
