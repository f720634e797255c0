package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// target is a peer's DC target as the MetaServer knows it.
type target struct {
	peer    *peer
	addr    string
	dct     uint32
	key     uint64
	version uint64
	ah      verbs.AH
}

// peer is a remote node this runtime talks to: its DC target and its RC
// connections, shared by every VQ connected to it.
type peer struct {
	rt   *Runtime
	node NodeID
	tgt  atomic.Pointer[target]
	rcl  atomic.Pointer[[]*pqp] // RC QPs VQs may use
	ops  atomic.Uint64          // requests pushed, for hotness

	mu       sync.Mutex // guards the fields below and RC changes
	building bool
	lastOps  uint64
	idle     int
}

func (p *peer) touch() { p.ops.Add(1) }

func (p *peer) target() *target { return p.tgt.Load() }

func (p *peer) rcs() []*pqp {
	if l := p.rcl.Load(); l != nil {
		return *l
	}
	return nil
}

// routeFor picks the physical QP for a VQ's requests: one of the peer's RC
// QPs if it has any, else the VQ's DCI. A VQ always maps to the same QP of
// a kind, so its requests stay in order.
func (p *peer) routeFor(q *Queue) *pqp {
	if l := p.rcs(); len(l) > 0 {
		return l[int(q.id)%len(l)]
	}
	d := p.rt.dcis
	return d[int(q.id)%len(d)]
}

// peerFor finds the peer for node: warm from the runtime's table, or cold
// through the meta cache and, on a miss, one READ of the MetaServer.
func (rt *Runtime) peerFor(ctx context.Context, node NodeID) (*peer, error) {
	rt.mu.RLock()
	p := rt.peers[node]
	closed := rt.closed
	rt.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("core: connect: %w", ErrClosed)
	}
	if p != nil {
		return p, nil
	}
	rt.count(&rt.stats.coldConnects)
	rec, err := rt.meta.Lookup(ctx, node)
	if err != nil {
		if errors.Is(err, meta.ErrNotFound) {
			err = fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		return nil, fmt.Errorf("core: connect to node %d: %w", node, err)
	}
	p = &peer{rt: rt, node: node}
	t, err := rt.newTarget(p, rec)
	if err != nil {
		return nil, err
	}
	p.tgt.Store(t)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if old := rt.peers[node]; old != nil {
		return old, nil
	}
	rt.peers[node] = p
	return p, nil
}

func (rt *Runtime) newTarget(p *peer, rec meta.Record) (*target, error) {
	ah, err := rt.addressHandle(rec)
	if err != nil {
		return nil, fmt.Errorf("core: address handle for node %d at %s: %w", rec.Node, rec.Addr, err)
	}
	return &target{peer: p, addr: rec.Addr, dct: rec.DCTNum, key: rec.DCKey, version: rec.Version, ah: ah}, nil
}

// addressHandle returns the runtime's address handle for the record's port,
// making it on first use: one per remote port, whatever its DCT.
func (rt *Runtime) addressHandle(rec meta.Record) (verbs.AH, error) {
	rt.ahMu.Lock()
	defer rt.ahMu.Unlock()
	if ah := rt.ahs[rec.Addr]; ah != nil {
		return ah, nil
	}
	ah, err := rt.pd.CreateAH(verbs.AHAttr{Dest: rec.Endpoint()})
	if err != nil {
		return nil, err
	}
	rt.ahs[rec.Addr] = ah
	return ah, nil
}

// refresh refetches the peer's record, bypassing the cache, and installs it
// if it changed: a DC target that failed may merely be stale (the node
// restarted with a new DCT). It reports whether the target changed.
func (p *peer) refresh(ctx context.Context) (bool, error) {
	rt := p.rt
	rt.meta.Invalidate(p.node)
	rec, err := rt.meta.Fetch(ctx, p.node)
	if err != nil {
		return false, err
	}
	old := p.target()
	if old != nil && old.addr == rec.Addr && old.dct == rec.DCTNum && old.key == rec.DCKey {
		return false, nil
	}
	t, err := rt.newTarget(p, rec)
	if err != nil {
		return false, err
	}
	p.tgt.Store(t)
	rt.count(&rt.stats.staleTargets)
	return true, nil
}

// addRC makes an RC QP available to the peer's VQs.
func (p *peer) addRC(q *pqp) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := append(append([]*pqp(nil), p.rcs()...), q)
	p.rcl.Store(&l)
}

// dropRC stops routing VQs to an RC QP; it reports whether it was there.
func (p *peer) dropRC(q *pqp) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var l []*pqp
	found := false
	for _, x := range p.rcs() {
		if x == q {
			found = true
			continue
		}
		l = append(l, x)
	}
	p.rcl.Store(&l)
	return found
}

// close destroys the peer's RC QPs and address handle.
func (p *peer) close() {
	for _, q := range p.rcs() {
		q.destroy()
	}
}

// Forget drops what the runtime knows of node: its cached DC target and
// meta cache entry, so the next Connect is cold (one MetaServer READ). RC
// QPs to the node stay until evicted. Benchmarks use it to measure cold
// connects; an application never needs it (stale targets are refetched).
func (rt *Runtime) Forget(node NodeID) {
	rt.mu.Lock()
	p := rt.peers[node]
	if p != nil && len(p.rcs()) == 0 {
		delete(rt.peers, node)
	}
	rt.mu.Unlock()
	rt.meta.Invalidate(node)
}
