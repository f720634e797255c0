package core

import "sort"

// peerLoad is what the pool policy knows of a peer after one window.
type peerLoad struct {
	node NodeID
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
// caller evicts them only if the other end is idle too (see evictIdle).
func (pp poolPolicy) plan(loads []peerLoad) (build, evict []NodeID) {
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
