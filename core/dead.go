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

// confirmDead marks p dead after a control call to it went unanswered or
// a request to it timed out (cause) only if judge, on a context of its
// own, finds it dead: a call bounded by a short deadline, on a loaded
// node, may merely have been slow, and a dead peer's requests are
// refused. It reports whether p is dead.
func (rt *Runtime) confirmDead(p *peer, cause error) bool {
	if p.dead.Load() != nil {
		return true
	}
	if err := rt.judge(p); err != nil {
		rt.markDead(p, fmt.Errorf("%w, then %w", cause, err))
		return true
	}
	return false
}

// Judging a peer dead. A request to it timed out or a control call went
// unanswered; on a loaded node that may only mean that this runtime did
// not run meanwhile (its timers and receive path run in its own process,
// where an RNIC's run on the card). judge pings the peer's control QP and
// this runtime's own at once, in rounds of up to probeTimeout: a round in
// which the runtime answered itself and the peer did not counts against
// the peer, and deathRounds of them make it dead; a round without the
// runtime's own answer shows only that the runtime did not run, and
// counts for nothing. After judgeRounds rounds a peer silent in every one
// is dead all the same. So a dead peer is known dead within
// deathRounds*probeTimeout (480 ms) of the judgement's start on a runtime
// that runs, and after judgeRounds*probeTimeout (1.6 s) by its own timers
// on one that hardly does; a live one is taken for dead only if it left deathRounds
// pings unanswered while this runtime answered its own, or this runtime
// could not answer itself for judgeRounds rounds in a row. The pings go to
// the control QP the runtime knows, its record not refetched (the callers
// have just done so): a refetch is a MetaServer READ that the peer's own
// answer does not need, and that this runtime's own, which it is compared
// with, does without.
const (
	deathRounds = 3
	judgeRounds = 10
)

// judge decides whether p is dead (see deathRounds): it returns why, or
// nil if p answered or the runtime stops first. A peer that another
// judgement found dead meanwhile is dead at once.
func (rt *Runtime) judge(p *peer) error {
	ctx, cancel := rt.untilStop()
	defer cancel()
	counted := 0
	for round := 1; ; round++ {
		if d := p.dead.Load(); d != nil {
			return d.cause // another judgement found it first
		}
		err, selfErr := rt.pingBoth(ctx, p)
		switch {
		case !peerSilent(err):
			if round > 1 && err == nil {
				rt.log.Info("peer slow, not dead: it answered a ping", "peer", p.node, "rounds", round, "counted", counted)
			}
			return nil
		case selfErr == nil:
			counted++
		}
		if counted == deathRounds || round == judgeRounds {
			return &silence{rounds: round, counted: counted, last: err}
		}
	}
}

// silence is judge's finding that a peer is dead: it left rounds pings
// unanswered, counted of them while this runtime answered its own.
type silence struct {
	rounds, counted int
	last            error
}

func (s *silence) Error() string {
	return fmt.Sprintf("%v (%d rounds, %d of them while this node answered its own ping)", s.last, s.rounds, s.counted)
}

func (s *silence) Unwrap() error { return s.last }

// pingBoth pings p and this runtime's own control QP at the same time,
// each for up to probeTimeout, and returns both outcomes.
func (rt *Runtime) pingBoth(ctx context.Context, p *peer) (peerErr, selfErr error) {
	self := make(chan error, 1)
	go func() { // owned here: waited for below
		sctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		self <- rt.ctrl.pingSelf(sctx)
	}()
	peerErr = rt.pingTarget(ctx, p)
	return peerErr, <-self
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
	return rt.pingWithin(ctx, p, func(pctx context.Context) error {
		_, err := p.refresh(pctx)
		if err == nil {
			_, err = rt.ctrl.callPeer(pctx, p, ctlPing, nil)
		}
		return err
	})
}

// pingTarget is ping without the refetch: it asks the control QP the
// runtime knows for p.
func (rt *Runtime) pingTarget(ctx context.Context, p *peer) error {
	return rt.pingWithin(ctx, p, func(pctx context.Context) error {
		_, err := rt.ctrl.callPeer(pctx, p, ctlPing, nil)
		return err
	})
}

// pingWithin runs ping, a ping of p, for up to probeTimeout; an answer
// that does not come by then is ErrNoReply.
func (rt *Runtime) pingWithin(ctx context.Context, p *peer, ping func(context.Context) error) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err := ping(pctx)
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
