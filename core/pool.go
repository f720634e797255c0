package core

import (
	"cmp"
	"slices"

	"github.com/krcore/krcore"
)

// QPType names the kind of a shared physical QP in a PoolQP.
type QPType string

// The kinds of shared physical QP.
const (
	// QPTypeDCT is the node's DC target, through which peers reach it.
	QPTypeDCT QPType = "dct"
	// QPTypeDCI is a DC initiator of the pool.
	QPTypeDCI QPType = "dci"
	// QPTypeRC is an RC QP to one peer.
	QPTypeRC QPType = "rc"
)

// QPState is the runtime's view of a shared physical QP, in a PoolQP.
type QPState string

// The states the runtime tracks for a shared physical QP.
const (
	// QPReady: in service; VQs' requests are posted to it.
	QPReady QPState = "ready"
	// QPConnecting: an RC QP being set up, connected but not in the pool
	// yet: the end that asked for it waits for the peer to pool its end,
	// the end that accepted it for the other to say its end is ready.
	QPConnecting QPState = "connecting"
	// QPDraining: an RC QP taken out of the pool (evicted for room or for
	// being cold, or closed by Forget); its requests in flight drain
	// before it closes.
	QPDraining QPState = "draining"
	// QPClosing: an RC QP one end of which has drained; it is destroyed
	// when the other end has too.
	QPClosing QPState = "closing"
	// QPRecovering: an error completion broke the QP; requests wait
	// while the runtime resets it (a DCI) or replaces it (an RC QP).
	QPRecovering QPState = "recovering"
	// QPError: the QP is gone for good (a DCI whose reset failed, or an
	// RC QP dropped after an error) and is being destroyed.
	QPError QPState = "error"
	// QPClosed: destroyed; it leaves the snapshot from now on.
	QPClosed QPState = "closed"
)

// PoolQP is one shared physical QP of the runtime, as PoolQPs reports it.
type PoolQP struct {
	// Type is dct, dci or rc.
	Type QPType `json:"type"`
	// QPN is the QP's number (for the DCT, the DCT number peers send to).
	QPN uint32 `json:"qpn"`
	// Peer is the node at the other end of an RC QP; 0 for DCT and DCIs,
	// which reach (or are reached by) any node.
	Peer krcore.NodeID `json:"peer,omitempty"`
	// RemoteQPN is the peer's end of an RC QP; 0 otherwise.
	RemoteQPN uint32 `json:"remote_qpn,omitempty"`
	// State is what the runtime tracks for the QP.
	State QPState `json:"state"`
	// VQs counts the virtual queues whose requests go to this QP: those
	// that posted to it last (a VQ changes QP when its peer's route does
	// and it has nothing in flight). Always 0 for the DCT.
	VQs int `json:"vqs"`
	// InFlight is the requests posted to the QP and not completed.
	InFlight int `json:"inflight"`
	// Queued is the requests waiting for room in the send queue or for
	// recovery to end.
	Queued int `json:"queued"`
	// Posted is the requests posted to the QP since it was created.
	Posted uint64 `json:"posted"`
}

// PoolQPs is a snapshot of the node's shared physical QPs: the DC target,
// the DC initiators and the RC QPs (including RC QPs leaving the pool, not
// yet closed), one entry each, ordered by type and then by peer and QP
// number. It reads the runtime's state under the locks that guard it and
// changes nothing; a closed runtime has none.
func (rt *Runtime) PoolQPs() []PoolQP {
	rt.mu.RLock()
	if rt.closed {
		rt.mu.RUnlock()
		return nil
	}
	qs := make([]*Queue, 0, len(rt.queues))
	for _, q := range rt.queues {
		qs = append(qs, q)
	}
	rt.mu.RUnlock()
	vqs := make(map[*pqp]int)
	for _, q := range qs {
		q.mu.Lock()
		r := q.route
		closed := q.closed
		q.mu.Unlock()
		if r != nil && !closed {
			vqs[r]++
		}
	}
	var out []PoolQP
	if rt.dct != nil {
		out = append(out, PoolQP{Type: QPTypeDCT, QPN: rt.dct.Num(), State: QPReady})
	}
	for _, p := range *rt.byQPN.Load() {
		out = append(out, p.snapshot(vqs[p]))
	}
	rank := map[QPType]int{QPTypeDCT: 0, QPTypeDCI: 1, QPTypeRC: 2}
	slices.SortFunc(out, func(a, b PoolQP) int {
		return cmp.Or(cmp.Compare(rank[a.Type], rank[b.Type]), cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.QPN, b.QPN))
	})
	return out
}

// snapshot describes the QP for PoolQPs, with vqs VQs routed to it.
func (p *pqp) snapshot(vqs int) PoolQP {
	s := PoolQP{Type: QPTypeDCI, QPN: p.qp.Num(), VQs: vqs}
	pooled := false
	if p.rc != nil {
		s.Type, s.Peer, s.RemoteQPN = QPTypeRC, p.rc.node, p.remoteQPN
		pooled = slices.Contains(p.rc.rcs(), p)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s.InFlight, s.Queued, s.Posted = p.n, len(p.backlog), p.next
	switch {
	case p.destroyed:
		s.State = QPClosed
	case p.dead:
		s.State = QPError
	case p.broken:
		s.State = QPRecovering
	case p.localDrained || p.remoteDrained:
		s.State = QPClosing
	case p.rc != nil && !pooled && p.pooled.Load():
		s.State = QPDraining
	case p.rc != nil && !pooled:
		s.State = QPConnecting
	default:
		s.State = QPReady
	}
	return s
}
