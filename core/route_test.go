package core

import (
	"math"
	"slices"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

func TestPlan(t *testing.T) {
	pp := poolPolicy{hotOps: 100, perPeer: 1, peers: 2, coldWindows: 3}
	cases := []struct {
		name         string
		loads        []peerLoad
		build, evict []krcore.NodeID
	}{
		{"nothing hot", []peerLoad{{node: 1, ops: 99}}, nil, nil},
		{"hot peers served hottest first within budget",
			[]peerLoad{{node: 1, ops: 100}, {node: 2, ops: 500}, {node: 3, ops: 300}}, []krcore.NodeID{2, 3}, nil},
		{"a peer with its K QPs is not rebuilt", []peerLoad{{node: 1, ops: 1000, rcs: 1}}, nil, nil},
		{"cold RC peers are evicted", []peerLoad{{node: 1, rcs: 1, built: 1, idle: 3}}, nil, []krcore.NodeID{1}},
		{"full budget: a hot peer displaces an idle RC peer",
			[]peerLoad{{node: 1, rcs: 1, built: 1, idle: 1}, {node: 2, rcs: 1, built: 1, ops: 10}, {node: 3, ops: 200}}, []krcore.NodeID{3}, []krcore.NodeID{1}},
		{"full budget, no idle holder: nothing changes",
			[]peerLoad{{node: 1, rcs: 1, built: 1, ops: 5}, {node: 2, rcs: 1, built: 1, ops: 10}, {node: 3, ops: 200}}, nil, nil},
		// An RC QP another node built carries its requests, unseen here:
		// its builder decides (with this end) when it is idle.
		{"an accepted RC QP is not evicted for idleness", []peerLoad{{node: 1, rcs: 1, idle: 1000}}, nil, nil},
		{"full budget: a hot peer does not displace an accepted RC QP",
			[]peerLoad{{node: 1, rcs: 1, idle: 5}, {node: 2, rcs: 1, built: 1, ops: 10}, {node: 3, ops: 200}}, nil, nil},
	}
	for _, c := range cases {
		b, e := pp.plan(c.loads)
		if !slices.Equal(b, c.build) || !slices.Equal(e, c.evict) {
			t.Errorf("%s: plan = build %v evict %v, want %v %v", c.name, b, e, c.build, c.evict)
		}
	}
	if b, e := (poolPolicy{hotOps: 1, peers: 0}).plan([]peerLoad{{node: 1, ops: 5}}); b != nil || e != nil {
		t.Error("RC disabled: plan built or evicted")
	}
}

func TestPickQP(t *testing.T) {
	rc0, rc1, rc2, dci0, dci1 := &pqp{}, &pqp{}, &pqp{}, &pqp{}, &pqp{}
	rcs, dcis := []*pqp{rc0, rc1}, []*pqp{dci0, dci1}
	cases := []struct {
		name      string
		vq        uint32
		rcs, dcis []*pqp
		want      *pqp
	}{
		{"a peer with RC QPs takes one", 3, rcs, dcis, rc1},
		{"the same krcore.VQ, the same RC QP", 5, rcs, dcis, rc1},
		{"VQs spread over the RC QPs", 4, rcs, dcis, rc0},
		{"no RC QP: the VQ's DCI", 3, nil, dcis, dci1},
		{"RC-only, no RC QP: no route", 3, nil, nil, nil},
		{"RC-only with an RC QP", 3, rcs[:1], nil, rc0},
		{"three RC QPs (not a power of two)", 5, []*pqp{rc0, rc1, rc2}, dcis, rc2},
		{"VQ 3 over three RC QPs: the first", 3, []*pqp{rc0, rc1, rc2}, dcis, rc0},
	}
	for _, c := range cases {
		if got := pickQP(c.vq, c.rcs, c.dcis); got != c.want {
			t.Errorf("%s: picked %p, want %p", c.name, got, c.want)
		}
	}
}

func TestKeepRC(t *testing.T) {
	cases := []struct {
		name           string
		peerIdle, need int
		err            error
		keep           bool
	}{
		{"the other end pushed more recently", 2, 5, nil, true},
		{"the other end idle as long", 5, 5, nil, false},
		{"the other end idle longer", 9, 5, nil, false},
		{"the other end does not answer", 0, 5, errRCRefused, false},
	}
	for _, c := range cases {
		if got := keepRC(c.peerIdle, c.err, c.need); got != c.keep {
			t.Errorf("%s: keepRC = %v, want %v", c.name, got, c.keep)
		}
	}
}

func TestMakeRoom(t *testing.T) {
	cases := []struct {
		name   string
		budget int
		hs     []holder
		victim int
		ok     bool
	}{
		{"below the budget: no eviction", 2, []holder{{node: 1, busy: true}}, -1, true},
		{"empty pool", 1, nil, -1, true},
		{"at the budget: the idle holder goes", 1, []holder{{node: 1}}, 0, true},
		{"every holder busy: no room", 2, []holder{{node: 1, busy: true}, {node: 2, busy: true}}, -1, false},
		{"a reserving peer is not evicted", 1, []holder{{node: 1, reserved: true}}, -1, false},
		{"the asking peer is not its own victim", 1, []holder{{node: 1, self: true}}, -1, false},
		{"a built RC QP goes before an accepted one, however cold",
			2, []holder{{node: 1, idle: 50}, {node: 2, built: true, idle: 1, ops: 9}}, 1, true},
		{"then the most idle windows",
			3, []holder{{node: 1, built: true, idle: 2}, {node: 2, built: true, idle: 7}, {node: 3, built: true, idle: 3}}, 1, true},
		{"then the fewest requests since the window",
			2, []holder{{node: 1, idle: 4, ops: 9}, {node: 2, idle: 4, ops: 3}}, 1, true},
		{"then the lowest node", 2, []holder{{node: 7, idle: 4}, {node: 2, idle: 4}}, 1, true},
		{"busy holders are skipped for colder idle ones",
			2, []holder{{node: 1, built: true, idle: 99, busy: true}, {node: 2, idle: 0, ops: 100}}, 1, true},
	}
	for _, c := range cases {
		v, ok := makeRoom(c.hs, c.budget)
		if v != c.victim || ok != c.ok {
			t.Errorf("%s: makeRoom = %d, %v, want %d, %v", c.name, v, ok, c.victim, c.ok)
		}
	}
}

func TestTriage(t *testing.T) {
	dc, rc := strategy(dcRC{}), strategy(rcAlone{})
	cases := []struct {
		name string
		s    strategy
		st   verbs.Status
		onRC bool
		want verdict
	}{
		{"DC: a refused DC request may have met a stale target", dc, verbs.RemAccessErr, false, verdict{refetch: true}},
		{"DC: an invalid request on a DCI too", dc, verbs.RemInvReqErr, false, verdict{refetch: true}},
		{"DC: a refused RC request is the culprit's", dc, verbs.RemAccessErr, true, verdict{}},
		{"DC: a local error is the culprit's", dc, verbs.LocProtErr, false, verdict{}},
		{"DC: a timeout on a DCI: the peer is dead", dc, verbs.RetryExcErr, false, verdict{dead: true}},
		{"DC: a timeout on an RC QP: the peer is dead", dc, verbs.RetryExcErr, true, verdict{dead: true}},
		{"RC-only: a timeout on an RC QP: ping the peer", rc, verbs.RetryExcErr, true, verdict{ping: true}},
		{"RC-only: a refused request is the culprit's", rc, verbs.RemAccessErr, true, verdict{}},
		{"RC-only: a flush with no failure of its own (the peer's end erred) blames no one", rc, verbs.WRFlushErr, true, verdict{flushed: true}},
		{"DC: a flushed RC QP blames no one", dc, verbs.WRFlushErr, true, verdict{flushed: true}},
	}
	for _, c := range cases {
		if got := c.s.triage(c.st, c.onRC); got != c.want {
			t.Errorf("%s: triage(%v) = %+v, want %+v", c.name, c.st, got, c.want)
		}
	}
}

func TestBlames(t *testing.T) {
	cases := []struct {
		name   string
		v      verdict
		stale  bool // the request went to a former life of its peer
		err    error
		blamed bool
	}{
		{"no refetch: the culprit's fault", verdict{}, false, nil, true},
		{"no refetch: a stale look is not taken", verdict{}, true, nil, true},
		{"the target was stale: not the culprit's fault", verdict{refetch: true}, true, nil, false},
		{"the target had not changed", verdict{refetch: true}, false, nil, true},
		{"the refetch failed", verdict{refetch: true}, true, errRCRefused, true},
		{"DC: a timeout at a former life: not the culprit's fault", verdict{dead: true}, true, nil, false},
		{"DC: a timeout at the peer's current life", verdict{dead: true}, false, nil, true},
		{"RC-only: a timeout at a former life", verdict{ping: true}, true, nil, false},
		{"RC-only: a timeout, the refetch failed", verdict{ping: true}, true, errRCRefused, true},
		{"a flushed QP: no request of its own failed", verdict{flushed: true}, false, nil, false},
	}
	for _, c := range cases {
		if got := c.v.blames(c.stale, c.err); got != c.blamed {
			t.Errorf("%s: blames = %v, want %v", c.name, got, c.blamed)
		}
	}
}

func TestSentence(t *testing.T) {
	qa, qb := &Queue{id: 1}, &Queue{id: 2}
	pa, pb := &peer{node: 1}, &peer{node: 2}
	ta, tb := &target{peer: pa}, &target{peer: pb}
	culprit := rec{q: qa, seq: 10, target: ta}
	rest := []rec{{q: qb, seq: 4, target: tb}, {q: qa, seq: 11, target: ta}, {q: qb, seq: 5, target: ta}, {q: qb, seq: 6, target: tb}}
	type out struct {
		q   *Queue
		seq uint64
		st  verbs.Status
	}
	type cs = []out
	const repost = verbs.Status(255) // not a WC status: marks a reposted request
	cases := []struct {
		name   string
		st     verbs.Status
		blamed bool
		dead   *peer
		want   cs
	}{
		{"the culprit's krcore.VQ fails, the others are reposted in order", verbs.RemAccessErr, true, nil,
			cs{{qa, 10, verbs.RemAccessErr}, {qa, 11, verbs.WRFlushErr}, {qb, 4, repost}, {qb, 5, repost}, {qb, 6, repost}}},
		{"a stale target: everything is reposted, the culprit first", verbs.RemAccessErr, false, nil,
			cs{{qa, 10, repost}, {qb, 4, repost}, {qa, 11, repost}, {qb, 5, repost}, {qb, 6, repost}}},
		{"a dead peer: its requests fail at once, other peers' are reposted", verbs.RetryExcErr, true, pa,
			cs{{qa, 10, verbs.RetryExcErr}, {qa, 11, verbs.WRFlushErr}, {qb, 5, verbs.RetryExcErr}, {qb, 4, repost}, {qb, 6, repost}}},
	}
	for _, c := range cases {
		fin, rp := sentence(culprit, rest, c.st, c.blamed, c.dead)
		var got cs
		for _, f := range fin {
			got = append(got, out{f.q, f.seq, f.status})
		}
		for _, r := range rp {
			got = append(got, out{r.q, r.seq, repost})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, got, c.want)
		}
	}
}

func TestStrategyPolicy(t *testing.T) {
	c := Config{HotOps: 10, RCPerPeer: 2, RCPeers: 3, ColdWindows: 4}
	if got, want := (dcRC{}).policy(c), (poolPolicy{hotOps: 10, perPeer: 2, peers: 3, coldWindows: 4}); got != want {
		t.Errorf("DC+RC policy = %+v, want %+v", got, want)
	}
	pp := (rcAlone{}).policy(c)
	if pp.coldWindows != math.MaxInt {
		t.Errorf("RC-only policy evicts cold RC QPs after %d windows: an RC QP is a peer's only route", pp.coldWindows)
	}
	// RC-only: a long-idle RC QP this node built stays; a hot peer still
	// gets its second RC QP.
	build, evict := pp.plan([]peerLoad{{node: 1, rcs: 1, built: 1, idle: 1 << 30}, {node: 2, rcs: 1, built: 1, ops: 50}})
	if !slices.Equal(build, []krcore.NodeID{2}) || evict != nil {
		t.Errorf("RC-only plan: build %v evict %v, want [2] []", build, evict)
	}
}

func TestStep(t *testing.T) {
	dci, rc := &pqp{}, &pqp{}
	cases := []struct {
		name      string
		cur, want *pqp
		inflight  int
		step      routeStep
	}{
		{"first post takes the route picked", nil, dci, 0, stepPost},
		{"the same route", dci, dci, 5, stepPost},
		{"a hot peer's RC QP, nothing in flight: migrate", dci, rc, 0, stepMigrate},
		{"a new route while requests are in flight: hold", dci, rc, 1, stepHold},
		{"back to DC after an eviction, requests in flight: hold", rc, dci, 3, stepHold},
		{"no route (RC-only, RC QPs evicted): reconnect", rc, nil, 0, stepReconnect},
		{"no route with requests in flight: reconnect", rc, nil, 2, stepReconnect},
	}
	for _, c := range cases {
		if got := step(c.cur, c.want, c.inflight); got != c.step {
			t.Errorf("%s: step = %d, want %d", c.name, got, c.step)
		}
	}
}

func TestMoved(t *testing.T) {
	old := &target{addr: "a", dct: 7, key: 9, ctrlQPN: 3}
	same := meta.Record{Addr: "a", DCTNum: 7, DCKey: 9, CtrlQPN: 3, Version: 42}
	cases := []struct {
		name  string
		old   *target
		rec   func(meta.Record) meta.Record
		moved bool
	}{
		{"the same target (a newer table version alone)", old, func(r meta.Record) meta.Record { return r }, false},
		{"no target yet", nil, func(r meta.Record) meta.Record { return r }, true},
		{"a new address", old, func(r meta.Record) meta.Record { r.Addr = "b"; return r }, true},
		{"a new DCT (the node restarted)", old, func(r meta.Record) meta.Record { r.DCTNum = 8; return r }, true},
		{"a new DC key", old, func(r meta.Record) meta.Record { r.DCKey = 10; return r }, true},
		{"a new control QP", old, func(r meta.Record) meta.Record { r.CtrlQPN = 4; return r }, true},
	}
	for _, c := range cases {
		if got := moved(c.old, c.rec(same)); got != c.moved {
			t.Errorf("%s: moved = %v, want %v", c.name, got, c.moved)
		}
	}
}
