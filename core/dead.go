package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/udrpc"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// Probing a dead peer: the first probe comes probeFirst after the death,
// each next one twice as late, up to probeMax; a probe waits probeTimeout
// for its answer. A control request from the peer probes at once.
const (
	probeFirst   = 20 * time.Millisecond
	probeMax     = time.Second
	probeTimeout = 8 * ctlTimeout
)

// deathNote is why and since when a peer is known dead, and the channel
// that wakes its probe (probeSoon): made at the death, not with the peer,
// so a cold connect allocates none.
type deathNote struct {
	since    time.Time
	cause    error
	probeNow chan struct{}
}

// deadErr is nil while p is not known dead, else an error naming it and
// wrapping ErrPeerDead.
func (p *peer) deadErr() error {
	d := p.dead.Load()
	if d == nil {
		return nil
	}
	return fmt.Errorf("node %d gave no answer (%v) and has not since %s: %w",
		p.node, d.cause, d.since.Format("15:04:05.000"), krcore.ErrPeerDead)
}

// markDead records that p stopped answering and starts the probe that
// finds it alive again.
func (rt *Runtime) markDead(p *peer, cause error) {
	d := &deathNote{since: time.Now(), cause: cause, probeNow: make(chan struct{}, 1)}
	if !p.dead.CompareAndSwap(nil, d) {
		return
	}
	rt.count(&rt.stats.peersDead)
	rt.log.Warn("peer dead: failing its requests at once until it answers again", "peer", p.node, "cause", cause)
	rt.background(func() { rt.probe(p, d) })
}

// confirmDead marks p dead after a control call to it went unanswered
// (cause) only if a ping, on a context of its own, goes unanswered too: a
// call bounded by a short deadline, on a loaded node, may merely have been
// slow, and a dead peer's requests are refused.
func (rt *Runtime) confirmDead(p *peer, cause error) {
	if p.dead.Load() != nil {
		return
	}
	ctx, cancel := rt.untilStop()
	defer cancel()
	if err := rt.ping(ctx, p); peerSilent(err) {
		rt.markDead(p, fmt.Errorf("%w, then %w", cause, err))
	}
}

// probe pings a dead peer, backing off, until it answers (the peer is
// alive again) or the runtime stops; d is the death it probes for.
func (rt *Runtime) probe(p *peer, d *deathNote) {
	ctx, cancel := rt.untilStop()
	defer cancel()
	wait := probeFirst
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.probeNow:
		}
		err := rt.ping(ctx, p)
		if err == nil {
			p.dead.Store(nil)
			rt.log.Info("peer alive again", "peer", p.node)
			return
		}
		rt.log.Debug("peer still dead", "peer", p.node, "err", err)
		wait = min(2*wait, probeMax)
		t.Reset(wait)
	}
}

// ping asks p's control QP for an answer, once its record is refetched
// (the node may have restarted with a new control QP and DC target).
// An answer that does not come within probeTimeout is ErrNoReply.
func (rt *Runtime) ping(ctx context.Context, p *peer) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := p.refresh(pctx)
	if err == nil {
		_, err = rt.ctrl.callPeer(pctx, p, ctlPing, nil)
	}
	if err != nil && ctx.Err() == nil && pctx.Err() != nil {
		err = fmt.Errorf("ping node %d: %w within %v", p.node, udrpc.ErrNoReply, probeTimeout)
	}
	return err
}

// probeSoon makes a dead peer's probe ping it now: something came from it.
func (p *peer) probeSoon() {
	d := p.dead.Load()
	if d == nil {
		return
	}
	select {
	case d.probeNow <- struct{}{}:
	default:
	}
}

// peerSilent reports whether a control call's error shows the peer gave
// no answer, or is no longer registered (its lease lapsed), rather than
// that this runtime closed or the caller gave up.
func peerSilent(err error) bool {
	return errors.Is(err, udrpc.ErrNoReply) || errors.Is(err, meta.ErrNotFound)
}

// deadRefusal is how a request to a dead peer completes: as on a private
// RC QP whose peer is gone, RETRY_EXC_ERR, but at once.
var deadRefusal = &refusal{verbs.RetryExcErr, "peer dead"}

// heardFrom notes a control request from node, sent from its control
// endpoint back: if it is known dead, its probe pings it now rather than
// at its next turn; if back is not the control QP the runtime knows for
// node, node restarted under the same id and its record is refetched
// now (within ctx), so that what this runtime sends it (an RC QP it asks
// for, replies to its requests) reaches its new life, not the former.
func (rt *Runtime) heardFrom(ctx context.Context, node krcore.NodeID, back verbs.Endpoint) {
	rt.mu.RLock()
	p := rt.peers[node]
	rt.mu.RUnlock()
	if p == nil {
		return
	}
	if t := p.target(); t.ctrlQPN != back.QPN {
		if _, err := p.refresh(ctx); err != nil {
			rt.log.Debug("refetching a restarted peer's record failed", "peer", node, "err", err)
		}
	}
	p.probeSoon()
}
