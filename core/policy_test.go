package core

import (
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	pp := poolPolicy{hotOps: 100, perPeer: 1, peers: 2, coldWindows: 3}
	cases := []struct {
		name         string
		loads        []peerLoad
		build, evict []NodeID
	}{
		{"nothing hot", []peerLoad{{node: 1, ops: 99}}, nil, nil},
		{"hot peers served hottest first within budget",
			[]peerLoad{{node: 1, ops: 100}, {node: 2, ops: 500}, {node: 3, ops: 300}}, []NodeID{2, 3}, nil},
		{"a peer with its K QPs is not rebuilt", []peerLoad{{node: 1, ops: 1000, rcs: 1}}, nil, nil},
		{"cold RC peers are evicted", []peerLoad{{node: 1, rcs: 1, built: 1, idle: 3}}, nil, []NodeID{1}},
		{"full budget: a hot peer displaces an idle RC peer",
			[]peerLoad{{node: 1, rcs: 1, built: 1, idle: 1}, {node: 2, rcs: 1, built: 1, ops: 10}, {node: 3, ops: 200}}, []NodeID{3}, []NodeID{1}},
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
