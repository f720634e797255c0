package daemon

import (
	"encoding/json"
	"fmt"
	"io"
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
		Denied: s.denied.Load(), QPs: s.rt.PoolQPs(), MetaEntries: s.rt.MetaEntries()}
	dcts := 1
	if st.Runtime.RCOnly {
		dcts = 0
	}
	st.Pool = []wire.PoolQPs{{Type: "dct", Count: dcts}, {Type: "dci", Count: st.Runtime.DCIs}, {Type: "rc", Count: st.Runtime.RCs}}
	if st.QPs == nil {
		st.QPs = []core.PoolQP{}
	}
	if st.MetaEntries == nil {
		st.MetaEntries = []meta.CacheEntry{}
	}
	s.mu.Lock()
	ss := make([]*session, 0, len(s.sessions))
	for _, x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	for _, x := range ss {
		st.Clients = append(st.Clients, x.snapshot())
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].ID < st.Clients[j].ID })
	return st
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
	b, err := encodeStatus(ss.s.Status(), wire.MaxMessage-wire.HeaderLen-2)
	if err != nil {
		return err
	}
	r.Str(string(b))
	return nil
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

// WriteMetrics writes the daemon's state in Prometheus' text format.
func (s *Server) WriteMetrics(w io.Writer) {
	st := s.Status()
	metric := func(name, typ, help string, v any, labels ...string) {
		fmt.Fprintf(w, "# HELP krcored_%s %s\n# TYPE krcored_%s %s\n", name, help, name, typ)
		if len(labels) == 0 {
			fmt.Fprintf(w, "krcored_%s %v\n", name, v)
		}
	}
	rs := st.Runtime
	metric("vqs", "gauge", "Virtual queues on the node (daemon and its own).", rs.VQs)
	metric("pool_qps", "gauge", "Shared physical QPs by type.", nil, "type")
	for _, p := range st.Pool {
		fmt.Fprintf(w, "krcored_pool_qps{type=%q} %d\n", p.Type, p.Count)
	}
	metric("connects_total", "counter", "VQ connects.", rs.Connects)
	metric("cold_connects_total", "counter", "Connects that read the MetaServer.", rs.ColdConnects)
	metric("meta_cache_hits_total", "counter", "Meta cache hits.", st.Meta.Hits)
	metric("meta_cache_misses_total", "counter", "Meta cache misses.", st.Meta.Misses)
	metric("meta_cache_entries", "gauge", "Records in the meta cache.", len(st.MetaEntries))
	metric("refusals_total", "counter", "Requests refused by protection.", rs.Refusals)
	metric("recoveries_total", "counter", "Shared QPs recovered after an error.", rs.Recoveries)
	metric("migrations_total", "counter", "VQ moves between DC and RC.", rs.Migrations)
	metric("clients", "gauge", "Attached clients.", len(st.Clients))
	metric("clients_reclaimed_total", "counter", "Clients gone and reclaimed.", st.Reclaim)
	metric("clients_denied_total", "counter", "Peers refused by uid/gid.", st.Denied)
	perClient := []struct {
		name, typ, help string
		get             func(*wire.ClientStatus) any
	}{
		{"client_vqs", "gauge", "A client's VQs.", func(c *wire.ClientStatus) any { return len(c.VQs) }},
		{"client_mr_bytes", "gauge", "Bytes a client registered.", func(c *wire.ClientStatus) any { return c.MRBytes }},
		{"client_pushes_total", "counter", "Requests a client pushed.", func(c *wire.ClientStatus) any { return c.Pushes }},
		{"client_completions_total", "counter", "Completions delivered to a client.", func(c *wire.ClientStatus) any { return c.Completions }},
		{"client_refusals_total", "counter", "A client's refused requests.", func(c *wire.ClientStatus) any { return c.Refusals }},
		{"client_naps_total", "counter", "Times a client's pump was paced beside an interactive client.", func(c *wire.ClientStatus) any { return c.Naps }},
	}
	for _, m := range perClient {
		metric(m.name, m.typ, m.help, nil, "client")
		for i := range st.Clients {
			c := &st.Clients[i]
			fmt.Fprintf(w, "krcored_%s{client=\"%d\",pid=\"%d\",uid=\"%d\"} %v\n", m.name, c.ID, c.PID, c.UID, m.get(c))
		}
	}
}
