package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// target is how to reach a peer, as the MetaServer knows it: its DC
// target (none in RC-only mode) and its control QP.
type target struct {
	peer     *peer
	addr     string
	dct      uint32
	key      uint64
	ctrlQPN  uint32
	ctrlQKey uint32
	version  uint64
	ah       verbs.AH
}

// peer is a remote node this runtime talks to: its target and its RC
// connections, shared by every VQ connected to it.
type peer struct {
	rt   *Runtime
	node krcore.NodeID
	tgt  atomic.Pointer[target]
	rcl  atomic.Pointer[[]*pqp] // RC QPs VQs may use
	ops  atomic.Uint64          // requests posted, for hotness (see pqp.countOp)
	// dead is set while the peer is known dead (see markDead).
	dead atomic.Pointer[deathNote]

	mu       sync.Mutex // guards the fields below and RC changes
	building bool
	evicting bool // evictIdleRCs is asking the peer
	lastOps  uint64
	idle     int
	// RC-only mode: a build in progress (closed when it ends), and whether
	// the peer counts toward RCPeers before its first RC is in the pool.
	pending  chan struct{}
	reserved bool // guarded by the runtime's poolMu
}

func (p *peer) target() *target { return p.tgt.Load() }

func (p *peer) rcs() []*pqp { return rcsOf(p.rcl.Load()) }

// rcsOf is the RC QPs of list l, a value of peer.rcl.
func rcsOf(l *[]*pqp) []*pqp {
	if l != nil {
		return *l
	}
	return nil
}

// routeFor is the physical QP for a VQ's requests to p now (see pickQP).
func (p *peer) routeFor(q *Queue) *pqp { return pickQP(q.id, p.rcs(), p.rt.dcis) }

// dciFor is q's DCI; nil without DC.
func (rt *Runtime) dciFor(q *Queue) *pqp { return pickQP(q.id, nil, rt.dcis) }

// peerFor finds the peer for node: warm from the runtime's table, or cold
// through the meta cache and, on a miss, one READ of the MetaServer.
func (rt *Runtime) peerFor(ctx context.Context, node krcore.NodeID) (*peer, error) {
	rt.mu.RLock()
	p := rt.peers[node]
	closed := rt.closed
	rt.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("core: connect: %w", krcore.ErrClosed)
	}
	if p != nil {
		return p, nil
	}
	if node == 0 {
		return nil, fmt.Errorf("core: connect to node 0, which names no node: %w", verbs.ErrInvalid)
	}
	rt.count(&rt.stats.coldConnects)
	rec, err := rt.meta.Lookup(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("core: connect to node %d: %w", node, lookupErr(err))
	}
	b := &born{p: peer{rt: rt, node: node}}
	p = &b.p
	if err := rt.setTarget(&b.t, p, rec); err != nil {
		return nil, err
	}
	p.tgt.Store(&b.t)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if old := rt.peers[node]; old != nil {
		return old, nil
	}
	rt.peers[node] = p
	return p, nil
}

// lookupErr adds to a failed MetaServer lookup the sentinel an
// application tests: ErrUnreachable when the node is not registered or the
// MetaServer could not be read (its READ failed, its record stayed torn),
// ErrClosed when the runtime is closing. A context that ended says so
// itself.
func lookupErr(err error) error {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, meta.ErrClosed):
		return fmt.Errorf("%w: %w", krcore.ErrClosed, err)
	}
	return fmt.Errorf("%w: %w", krcore.ErrUnreachable, err)
}

// born is a new peer with its first target, allocated together: a cold
// connect then allocates once for both.
type born struct {
	p peer
	t target
}

func (rt *Runtime) newTarget(p *peer, rec meta.Record) (*target, error) {
	t := new(target)
	if err := rt.setTarget(t, p, rec); err != nil {
		return nil, err
	}
	return t, nil
}

// setTarget fills t, p's target at rec.
func (rt *Runtime) setTarget(t *target, p *peer, rec meta.Record) error {
	ah, err := rt.addressHandle(rec.Endpoint())
	if err != nil {
		return fmt.Errorf("core: address handle for node %d at %s: %w", rec.Node, rec.Addr, err)
	}
	*t = target{peer: p, addr: rec.Addr, dct: rec.DCTNum, key: rec.DCKey, ctrlQPN: rec.CtrlQPN, ctrlQKey: rec.CtrlQKey, version: rec.Version, ah: ah}
	return nil
}

// addressHandle returns the runtime's address handle for a remote port,
// making it on first use: one per port, whatever QP is addressed through it.
func (rt *Runtime) addressHandle(ep verbs.Endpoint) (verbs.AH, error) {
	k := portKey{addr: ep.Addr, gid: ep.GID, lid: ep.LID}
	rt.ahMu.Lock()
	defer rt.ahMu.Unlock()
	if ah := rt.ahs[k]; ah != nil {
		return ah, nil
	}
	ah, err := rt.pd.CreateAH(verbs.AHAttr{Dest: ep})
	if err != nil {
		return nil, err
	}
	rt.ahs[k] = ah
	return ah, nil
}

// portKey names a remote port: by fabric address on the soft fabric, by
// GID or LID on RoCE and InfiniBand (where the address is empty).
type portKey struct {
	addr string
	gid  verbs.GID
	lid  uint16
}

// refresh refetches the peer's record, bypassing the cache, and installs it
// if it changed: a target that failed may merely be stale (the node
// restarted under the same id, with a new DCT, control QP and QPs). The
// RC QPs to its former life leave the pool (dropStaleRCs). It reports
// whether the target changed.
func (p *peer) refresh(ctx context.Context) (bool, error) {
	rt := p.rt
	old := p.target()
	rt.meta.Invalidate(p.node)
	rec, err := rt.meta.Fetch(ctx, p.node)
	if err != nil {
		return false, err
	}
	if !moved(old, rec) {
		return false, nil
	}
	t, err := rt.newTarget(p, rec)
	if err != nil {
		return false, err
	}
	if !p.tgt.CompareAndSwap(old, t) {
		return true, nil // a concurrent refresh installed it
	}
	rt.count(&rt.stats.staleTargets)
	rt.log.Info("peer restarted: new target, RC QPs to its former life dropped", "peer", p.node, "addr", t.addr, "dct", t.dct)
	rt.dropStaleRCs(p, t)
	return true, nil
}

// dropStaleRCs takes out of p's pool the RC QPs connected to another life
// of p than cur: their other end is gone, so every request on them would
// time out, and p's VQs would keep choosing them. New requests take p's
// other routes (DC; in RC-only mode a new RC QP, which the VQ builds);
// requests already on a stale QP time out and recovery reposts them to
// cur. Nothing is left to tell the other end: the QP is destroyed once it
// has drained (or Close began).
func (rt *Runtime) dropStaleRCs(p *peer, cur *target) {
	for _, pq := range p.rcs() {
		if pq.tgt == cur || !p.dropRC(pq) {
			continue
		}
		rt.count(&rt.stats.rcEvicted)
		if rt.stopped() {
			pq.destroy() // no drain: Close fails what is left
			continue
		}
		rt.background(func() {
			pq.drain(rt.stop) // until drained, or Close
			pq.destroy()
		})
	}
}

// sentTo is the life of its peer that r, failed on p, was sent to: an RC
// QP's own, a DCI request's target.
func (p *pqp) sentTo(r rec) *target {
	if p.rc != nil && p.tgt != nil {
		return p.tgt
	}
	return r.target
}

// addRC makes an RC QP available to the peer's VQs (once: a retried
// ready message adds nothing).
func (p *peer) addRC(q *pqp) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.rcs() {
		if x == q {
			return
		}
	}
	q.pooled.Store(true)
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

// Forget drops what the runtime knows of node: its cached target and meta
// cache entry, so the next Connect is cold (one MetaServer READ). With DC,
// RC QPs to the node stay until evicted; in RC-only mode they are closed
// (both ends, which ctx bounds), so the next Connect builds one again.
// Benchmarks use it to measure cold connects; an application never needs it
// (stale targets are refetched).
func (rt *Runtime) Forget(ctx context.Context, node krcore.NodeID) error {
	rt.mu.RLock()
	p := rt.peers[node]
	rt.mu.RUnlock()
	var err error
	if p != nil {
		err = rt.routes.forget(ctx, p)
	}
	rt.mu.Lock()
	if p != nil && rt.peers[node] == p && len(p.rcs()) == 0 {
		delete(rt.peers, node)
	}
	rt.mu.Unlock()
	rt.meta.Invalidate(node)
	return err
}
