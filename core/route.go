package core

import (
	"sort"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// The runtime's routing choices are pure functions of what it observes:
// the hot/cold plan (per-peer loads), the RC-only budget (which holder
// makes room), recovery's triage (what a failed completion means and what
// becomes of the requests it caught) and the route a VQ's requests take
// (pickQP, step). The code around them (manage.go, rconly.go, recover.go,
// queue.go) samples the observations and carries the decisions out with
// verbs and control calls; where DC+RC and RC-only decide differently
// (triage, the pool policy) each route strategy (strategy.go) has its own
// pure method. Tests feed them inputs directly, with no device
// (route_test.go).

// pickQP is the route decision: the physical QP a VQ's requests take.
// One of the peer's pooled RC QPs if it has any, else the VQ's DCI; nil
// when there is neither (RC-only, while the peer has no RC QP). A VQ
// always maps to the same QP of a kind, so its requests stay in order.
func pickQP(vq uint32, rcs, dcis []*pqp) *pqp {
	qps := rcs
	if len(qps) == 0 {
		qps = dcis
	}
	if len(qps) == 0 {
		return nil
	}
	return qps[spread(vq, len(qps))] // one spread: small enough to inline
}

// spread is vq modulo n (n > 0): by a mask when n is a power of two (the
// DCI pools and most RC lists), since pickQP runs on every request and an
// integer division costs more than the rest of it.
func spread(vq uint32, n int) int {
	if m := uint32(n); m&(m-1) == 0 {
		return int(vq & (m - 1))
	}
	return int(vq % uint32(n))
}

// routeStep is what a VQ does with the records it posts (see step).
type routeStep int

const (
	stepPost      routeStep = iota // post on the route picked, the VQ's first or current one
	stepMigrate                    // move to the route picked, then post: nothing is in flight
	stepHold                       // hold them: the VQ's requests in flight would be overtaken
	stepReconnect                  // hold them and get a route: there is none (RC-only)
)

// step decides how a VQ posts, given the QP it last posted to (cur), the
// QP pickQP picks now (want) and its requests in flight: it changes QP only
// when nothing is in flight, so its requests never overtake each other.
func step(cur, want *pqp, inflight int) routeStep {
	switch {
	case want == nil:
		return stepReconnect
	case want == cur:
		return stepPost
	case inflight > 0:
		return stepHold
	case cur == nil:
		return stepPost
	}
	return stepMigrate
}

// peerLoad is what the pool policy knows of a peer after one window.
type peerLoad struct {
	node krcore.NodeID
	ops  uint64 // requests pushed to the peer in the window
	rcs  int    // RC QPs the peer has
	// built is how many of them this node built. An RC QP another node
	// built carries that node's requests, which this one never sees (a
	// one-sided READ costs the target no CPU): only its builder can tell
	// whether it is idle, so only the builder evicts it.
	built int
	idle  int // consecutive windows without requests
}

// poolPolicy bounds and shapes the RC pool.
type poolPolicy struct {
	hotOps      uint64 // ops in a window that make a peer hot
	perPeer     int    // K
	peers       int    // N: peers that may hold RC QPs
	coldWindows int    // idle windows after which an RC QP is evicted
}

// plan decides, from one window's loads, which peers get a new RC QP and
// which lose theirs. It is pure: same loads, same plan. Hot peers are
// served hottest first while the budget of N peers lasts; when it is full a
// hot peer may take the place of the coldest RC peer if that one was idle
// in this window. Peers idle for coldWindows lose their RC QPs regardless.
// Only RC QPs this node built are evicted (see peerLoad.built), and the
// caller evicts them only if the other end is idle too (see keepRC).
func (pp poolPolicy) plan(loads []peerLoad) (build, evict []krcore.NodeID) {
	if pp.peers <= 0 {
		return nil, nil
	}
	holders := 0
	var cold []peerLoad
	for _, l := range loads {
		if l.rcs == 0 {
			continue
		}
		if l.built > 0 && l.idle >= pp.coldWindows {
			evict = append(evict, l.node)
			continue
		}
		holders++
		if l.built > 0 && l.ops == 0 {
			cold = append(cold, l)
		}
	}
	var hot []peerLoad
	for _, l := range loads {
		if l.ops >= pp.hotOps && l.rcs < pp.perPeer {
			hot = append(hot, l)
		}
	}
	sort.Slice(hot, func(i, j int) bool {
		return hot[i].ops > hot[j].ops || hot[i].ops == hot[j].ops && hot[i].node < hot[j].node
	})
	sort.Slice(cold, func(i, j int) bool {
		return cold[i].idle > cold[j].idle || cold[i].idle == cold[j].idle && cold[i].node < cold[j].node
	})
	for _, h := range hot {
		switch {
		case h.rcs > 0 || holders < pp.peers:
			if h.rcs == 0 {
				holders++
			}
		case len(cold) > 0:
			evict = append(evict, cold[0].node)
			cold = cold[1:]
		default:
			continue
		}
		build = append(build, h.node)
	}
	return build, evict
}

// keepRC decides whether an RC QP the plan would evict stays because its
// other end still uses it: the other end answered (err nil) that it has
// pushed nothing for peerIdle windows, fewer than need (this end's idle
// windows, up to coldWindows). A peer that does not answer is not using it.
func keepRC(peerIdle int, err error, need int) bool {
	return err == nil && peerIdle < need
}

// holder is what the RC-only budget knows of a peer holding RC QPs, or
// reserving a place while it builds its first.
type holder struct {
	node     krcore.NodeID
	self     bool   // the peer that needs the place
	reserved bool   // building its first RC QP
	busy     bool   // an RC QP of it has requests in flight or queued, or is broken
	built    bool   // it holds an RC QP this node built
	idle     int    // consecutive windows without requests
	ops      uint64 // requests since the last window
}

// makeRoom decides whether a peer may take a place in an RC-only budget
// of budget peers, given the holders (itself among them if it holds one).
// Below the budget it may, evicting no one (victim -1). At the budget the
// victim is the coldest holder other than the peer itself, not reserving,
// whose RC QPs are all idle: one holding an RC QP this node built before
// one holding only QPs it accepted (their builder's one-sided requests are
// invisible here: it may keep them hot), then most idle windows, then
// fewest requests since the last window, then lowest node. With no such
// holder ok is false: every place is busy (krcore.ErrNoQP).
func makeRoom(hs []holder, budget int) (victim int, ok bool) {
	if len(hs) < budget {
		return -1, true
	}
	victim = -1
	for i, h := range hs {
		if h.self || h.reserved || h.busy {
			continue
		}
		if victim < 0 || colder(h, hs[victim]) {
			victim = i
		}
	}
	return victim, victim >= 0
}

// colder orders eviction candidates for makeRoom: a before b.
func colder(a, b holder) bool {
	switch {
	case a.built != b.built:
		return a.built
	case a.idle != b.idle:
		return a.idle > b.idle
	case a.ops != b.ops:
		return a.ops < b.ops
	}
	return a.node < b.node
}

// verdict is what recovery makes of a failed completion before it looks
// at the requests it caught (see the strategies' triage).
type verdict struct {
	// refetch: the DC target may be stale (the node restarted with a new
	// DCT); refetch it, and blame the culprit only if it did not change.
	refetch bool
	// dead: the request timed out on a route that only a dead peer
	// leaves unanswered; if judge finds the peer dead (this runtime may
	// merely not have run), every request to it fails at once.
	dead bool
	// ping: the request timed out on an RC QP whose other end may be gone
	// while the peer lives; judge tells which, and the peer's requests
	// are reposted on the QP repair builds.
	ping bool
	// flushed: the failure was WR_FLUSH_ERR at the head of the QP, so no
	// request of its own failed: the QP went to ERR under them, as an RC
	// responder's does when it NAKs the other end's request (IB class B
	// and C errors). Nothing is blamed; every request is reposted.
	flushed bool
}

// moved reports whether a peer's refetched record names another target
// than the one the runtime has (none yet counts as moved): the node
// restarted, with a new address, DC target or control QP.
func moved(old *target, rec meta.Record) bool {
	return old == nil || old.addr != rec.Addr || old.dct != rec.DCTNum || old.key != rec.DCKey || old.ctrlQPN != rec.CtrlQPN
}

// staleSuspect reports that a DC request's status may come from a stale
// target rather than from the request: the remote refused it.
func staleSuspect(st verbs.Status, onRC bool) bool {
	return !onRC && (st == verbs.RemAccessErr || st == verbs.RemInvReqErr)
}

// timedOut reports that the request timed out (RETRY_EXC_ERR): the peer
// may be dead or restarted, so its meta cache entry is dropped.
func (v verdict) timedOut() bool { return v.dead || v.ping }

// refetches reports that the peer's record is refetched before the
// culprit is judged: its target may be stale (a refusal on DC), or the
// request may have gone to a former life of the peer (a timeout: a node
// that restarted under the same id never answers on its old QPs).
func (v verdict) refetches() bool { return v.refetch || v.timedOut() }

// blames decides, once any refetch is done, whether the culprit's request
// was at fault: always, unless the QP was flushed under it (no request of
// its own failed), or the record was refetched (err nil) and names another
// life of the peer than the one the request went to (stale): the node
// restarted under the same id, the request is reposted to its new life and
// the peer is not dead.
func (v verdict) blames(stale bool, err error) bool {
	if v.flushed {
		return false
	}
	return !v.refetches() || err != nil || !stale
}

// sentence decides the fate of the requests a QP error caught, in order:
// a blamed culprit completes with st and its own VQ's requests behind it
// with WR_FLUSH_ERR (as on a private QP); requests to a dead peer complete
// with RETRY_EXC_ERR; everything else (an unblamed culprit included) is
// reposted in its order.
func sentence(culprit rec, rest []rec, st verbs.Status, blamed bool, dead *peer) (fin []finished, repost []rec) {
	if blamed {
		fin = append(fin, finished{q: culprit.q, seq: culprit.seq, status: st})
	} else {
		repost = append(repost, culprit)
	}
	for _, r := range rest {
		switch {
		case blamed && r.q == culprit.q:
			fin = append(fin, finished{q: r.q, seq: r.seq, status: verbs.WRFlushErr})
		case dead != nil && r.target.peer == dead:
			fin = append(fin, finished{q: r.q, seq: r.seq, status: verbs.RetryExcErr})
		default:
			repost = append(repost, r)
		}
	}
	return fin, repost
}
