package core

import (
	"context"
	"math"

	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// strategy is how the runtime routes VQs' requests: over DC with RC QPs
// for hot peers (dcRC), or over RC QPs alone on a device without DC
// (rcAlone). New picks one, once; the data path, recovery and the pool
// manager ask it rather than test a mode. The decisions it makes are pure
// (route.go); its other methods carry them out.
type strategy interface {
	// setup creates the shared QPs the strategy routes over besides the
	// RC pool.
	setup() error
	// metaConfig is how the embedded MetaServer serves and the meta
	// client reads.
	metaConfig() (meta.ServerConfig, meta.ClientConfig)
	// policy is the pool policy the manager plans with.
	policy(Config) poolPolicy
	// routable reports, cheaply, that a VQ to p may post without a route
	// being made first (see connect).
	routable(p *peer) bool
	// connect makes p a route for Connect, within ctx.
	connect(ctx context.Context, p *peer) error
	// lost handles records a route refused because its QP is gone for
	// good (not in flight); q.mu held.
	lost(q *Queue, rs []rec)
	// admit decides whether a peer that asks for an RC QP gets one.
	admit(p *peer) error
	// triage says what a failed completion on a QP (an RC QP if onRC)
	// means: pure.
	triage(st verbs.Status, onRC bool) verdict
	// repairRC takes a broken RC QP out of service and reposts the
	// requests recovery saved.
	repairRC(p *pqp, repost []rec)
	// forget drops what the strategy holds for p (Forget).
	forget(ctx context.Context, p *peer) error
}

// newStrategy picks the runtime's strategy from its configuration.
func newStrategy(rt *Runtime) strategy {
	if rt.cfg.RCOnly {
		return rcAlone{rt}
	}
	return dcRC{rt}
}

// dcRC routes over DC: every VQ has a DCI, which reaches any peer with no
// connection, and hot peers get RC QPs in the background (manage). An RC
// QP is an optimisation here: a broken or evicted one sends its requests
// back to DC.
type dcRC struct{ rt *Runtime }

func (s dcRC) setup() error { return s.rt.setupDC() }

func (dcRC) metaConfig() (meta.ServerConfig, meta.ClientConfig) {
	return meta.ServerConfig{}, meta.ClientConfig{}
}

func (dcRC) policy(c Config) poolPolicy {
	return poolPolicy{hotOps: uint64(c.HotOps), perPeer: c.RCPerPeer, peers: c.RCPeers, coldWindows: c.ColdWindows}
}

func (dcRC) routable(*peer) bool { return true }

func (dcRC) connect(context.Context, *peer) error { return nil }

// lost fails the records: their QP is a DCI whose repair failed.
func (dcRC) lost(q *Queue, rs []rec) { q.flushLocked(rs) }

func (dcRC) admit(*peer) error { return nil }

// triage: a DC request the remote refused may have met a stale target; a
// request that timed out, on a DCI or an RC QP, has its peer judged; a QP
// flushed with no failure of its own (its RC peer erred) blames no one.
func (dcRC) triage(st verbs.Status, onRC bool) verdict {
	return verdict{refetch: staleSuspect(st, onRC), dead: st == verbs.RetryExcErr, flushed: st == verbs.WRFlushErr}
}

// repairRC drops the RC QP and moves its requests to their VQs' DCIs.
func (s dcRC) repairRC(p *pqp, repost []rec) {
	p.rc.dropRC(p)
	repost = p.shut(repost)
	for _, r := range repost {
		s.rt.failRecs(s.rt.dciFor(r.q).post([]rec{r}), verbs.WRFlushErr)
	}
	p.destroy()
}

// forget keeps the RC QPs: the manager evicts them when cold.
func (dcRC) forget(context.Context, *peer) error { return nil }

// rcAlone routes over RC QPs alone (a device without DC, or
// Config.RCOnly): a VQ's peer needs an RC QP before it can post, the pool
// holds RCPeers peers, and a new peer takes the place of an idle one
// (rconly.go).
type rcAlone struct{ rt *Runtime }

func (rcAlone) setup() error { return nil }

// metaConfig: the embedded server has no DCT and the client READs over RC.
func (rcAlone) metaConfig() (meta.ServerConfig, meta.ClientConfig) {
	return meta.ServerConfig{NoDC: true}, meta.ClientConfig{RCReads: true}
}

// policy: without DC an RC QP is a peer's only route: it is evicted when
// a new peer needs the room (reserve), not for being cold.
func (rcAlone) policy(c Config) poolPolicy {
	pp := dcRC{}.policy(c)
	pp.coldWindows = math.MaxInt
	return pp
}

// routable: a peer with an RC QP, or a dead one (whose requests are
// refused before any route: see Queue.accept).
func (rcAlone) routable(p *peer) bool { return len(p.rcs()) > 0 || p.dead.Load() != nil }

func (s rcAlone) connect(ctx context.Context, p *peer) error { return s.rt.ensureRC(ctx, p) }

// lost holds the records for a new RC QP: theirs was evicted as the VQ
// chose it.
func (rcAlone) lost(q *Queue, rs []rec) {
	q.held = append(q.held, rs...)
	q.reconnect()
}

// admit: the peer must fit the budget (see reserve).
func (s rcAlone) admit(p *peer) error { return s.rt.reserve(p) }

// triage: an RC QP whose other end is gone times out while its peer
// lives; judge tells which, and a live peer's requests move to the new
// RC QP repair builds.
func (rcAlone) triage(st verbs.Status, onRC bool) verdict {
	timeout := st == verbs.RetryExcErr
	return verdict{refetch: staleSuspect(st, onRC), dead: timeout && !onRC, ping: timeout && onRC, flushed: st == verbs.WRFlushErr}
}

func (s rcAlone) repairRC(p *pqp, repost []rec) { s.rt.replaceRC(p, repost) }

// forget closes the peer's RC QPs, both ends, so the next Connect builds
// one again.
func (s rcAlone) forget(ctx context.Context, p *peer) error { return s.rt.closeRCs(ctx, p) }
