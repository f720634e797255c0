package core

import (
	"context"
	"math"
	"time"
)

// manage runs the pool policy every HotWindow until the runtime stops.
func (rt *Runtime) manage() {
	defer rt.wg.Done()
	if rt.cfg.RCPeers < 0 {
		<-rt.stop
		return
	}
	pp := poolPolicy{hotOps: uint64(rt.cfg.HotOps), perPeer: rt.cfg.RCPerPeer, peers: rt.cfg.RCPeers, coldWindows: rt.cfg.ColdWindows}
	if rt.rcOnly {
		// Without DC an RC QP is a peer's only route: it is evicted when
		// a new peer needs the room (reserve), not for being cold.
		pp.coldWindows = math.MaxInt
	}
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
			p := byNode[n]
			for _, pq := range p.rcs() {
				rt.background(func() { rt.evictRC(pq) })
			}
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
func (rt *Runtime) loads() ([]peerLoad, map[NodeID]*peer) {
	rt.mu.Lock()
	peers := make([]*peer, 0, len(rt.peers))
	for _, p := range rt.peers {
		peers = append(peers, p)
	}
	rt.mu.Unlock()
	loads := make([]peerLoad, 0, len(peers))
	byNode := make(map[NodeID]*peer, len(peers))
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
		l := peerLoad{node: p.node, ops: d, rcs: len(p.rcs()), idle: p.idle}
		p.mu.Unlock()
		loads = append(loads, l)
		byNode[p.node] = p
	}
	return loads, byNode
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
