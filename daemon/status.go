package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// Status reports the daemon's state.
func (s *Server) Status() wire.Status {
	st := wire.Status{Node: s.rt.Node(), Socket: s.cfg.Socket, Uptime: time.Since(s.start).Round(time.Second).String(),
		Runtime: s.rt.Stats(), Meta: s.rt.MetaStats(), Attached: s.attached.Load(), Reclaim: s.reclaimed.Load(),
		Denied: s.denied.Load(), QPs: qpStatuses(s.rt.PoolQPs()), MetaEntries: s.rt.MetaEntries()}
	dcts := 1
	if st.Runtime.RCOnly {
		dcts = 0
	}
	st.Pool = []wire.PoolQPs{{Type: "dct", Count: dcts}, {Type: "dci", Count: st.Runtime.DCIs}, {Type: "rc", Count: st.Runtime.RCs}}
	st.MetaSource = s.rt.MetaSource()
	for _, i := range s.rt.MetaServers() {
		st.MetaServers = append(st.MetaServers, i.String())
	}
	if st.MetaEntries == nil {
		st.MetaEntries = []meta.CacheEntry{}
	}
	for _, x := range s.sessionList() {
		st.Clients = append(st.Clients, x.snapshot())
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].ID < st.Clients[j].ID })
	return st
}

// sessionList is the attached clients' sessions, in no order.
func (s *Server) sessionList() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := make([]*session, 0, len(s.sessions))
	for _, x := range s.sessions {
		ss = append(ss, x)
	}
	return ss
}

// qpStatuses is the runtime's shared QPs as the status document lists
// them (never nil: an empty list, not null).
func qpStatuses(qps []core.PoolQP) []wire.QPStatus {
	out := make([]wire.QPStatus, len(qps))
	for i, q := range qps {
		out[i] = wire.QPStatus{Type: string(q.Type), QPN: q.QPN, Peer: q.Peer, RemoteQPN: q.RemoteQPN, State: string(q.State),
			VQs: q.VQs, InFlight: q.InFlight, Queued: q.Queued, Posted: q.Posted}
	}
	return out
}

func (ss *session) snapshot() wire.ClientStatus {
	c := wire.ClientStatus{ID: ss.id, PID: ss.cred.Pid, UID: ss.cred.Uid, GID: ss.cred.Gid, Pushes: ss.pushes.Load(),
		Completions: ss.completions.Load(), Refusals: ss.refusals.Load(), Calls: ss.calls.Load(), RingCalls: ss.ringCalls.Load(), Naps: ss.naps.Load(), Exports: []string{}}
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	c.MRs, c.MRBytes, c.Regions = len(ss.mrs), ss.mrBytes, len(ss.regions)
	for name := range ss.exports {
		c.Exports = append(c.Exports, name)
	}
	slices.Sort(c.Exports)
	for _, v := range ss.vqs {
		c.VQs = append(c.VQs, wire.VQStatus{ID: v.id, Node: v.node.Load(), Port: v.port.Load(), Outstanding: v.q.Outstanding()})
	}
	sort.Slice(c.VQs, func(i, j int) bool { return c.VQs[i].ID < c.VQs[j].ID })
	return c
}

func (ss *session) status(r *wire.Msg) error {
	st := visibleTo(ss.s.Status(), ss.cred.Uid, uint32(os.Geteuid()))
	b, err := encodeStatus(st, wire.MaxMessage-wire.HeaderLen-2)
	if err != nil {
		return err
	}
	r.Str(string(b))
	return nil
}

// visibleTo is st as a client of user uid sees it through OpStatus, the
// daemon running as user owner: root and the daemon's owner see every
// client; any other user sees its own clients in full and the others only
// counted (ClientsHidden), since a client's rows name its exports, its
// process and the nodes and ports its queues talk to, which are no other
// user's business. The node's own state (runtime, pool, meta cache) is
// every client's.
func visibleTo(st wire.Status, uid, owner uint32) wire.Status {
	if uid == 0 || uid == owner {
		return st
	}
	mine := make([]wire.ClientStatus, 0, len(st.Clients))
	for _, c := range st.Clients {
		if sees(uid, owner, c.UID) {
			mine = append(mine, c)
		}
	}
	st.ClientsHidden = len(st.Clients) - len(mine)
	st.Clients = mine
	return st
}

// sees reports whether a client of user viewer may see what a client of
// user subject owns (its status row, its reports), the daemon running as
// user owner: root, the owner and the subject's own user may.
func sees(viewer, owner, subject uint32) bool {
	return viewer == 0 || viewer == owner || viewer == subject
}

// encodeStatus is st as JSON in at most limit bytes. If it does not fit,
// the meta cache's entries and then the QP rows are cut, from the end,
// and counted in MetaOmitted and QPsOmitted; if it still does not fit,
// encodeStatus fails with verbs.ErrLimit.
func encodeStatus(st wire.Status, limit int) ([]byte, error) {
	for {
		b, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("status: %w", err)
		}
		if len(b) <= limit {
			return b, nil
		}
		switch {
		case len(st.MetaEntries) > 0:
			k := len(st.MetaEntries) / 2
			st.MetaOmitted += len(st.MetaEntries) - k
			st.MetaEntries = st.MetaEntries[:k:k]
		case len(st.QPs) > 0:
			k := len(st.QPs) / 2
			st.QPsOmitted += len(st.QPs) - k
			st.QPs = st.QPs[:k:k]
		default:
			return nil, fmt.Errorf("status of %d bytes does not fit a message of %d: %w", len(b), limit, verbs.ErrLimit)
		}
	}
}
