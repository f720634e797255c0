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

// Status is a snapshot of the daemon, what krctl shows.
type Status struct {
	Node    core.NodeID      `json:"node"`
	Socket  string           `json:"socket"`
	Uptime  string           `json:"uptime"`
	Runtime core.Stats       `json:"runtime"`
	Meta    meta.ClientStats `json:"meta_cache"`
	// Pool counts the shared QPs in service by type: the DCT (none
	// without DC), the DCIs and the RC QPs in their peers' pools.
	Pool []PoolQPs `json:"pool"`
	// QPs lists the shared QPs one by one (core.Runtime.PoolQPs),
	// including RC QPs entering or leaving the pool, which Pool does not
	// count.
	QPs []core.PoolQP `json:"qps"`
	// MetaEntries lists the meta cache's records (core.Runtime.MetaEntries).
	MetaEntries []meta.CacheEntry `json:"meta_entries"`
	// QPsOmitted and MetaOmitted count rows left out of QPs and
	// MetaEntries because the status would not fit a wire message.
	QPsOmitted  int            `json:"qps_omitted,omitempty"`
	MetaOmitted int            `json:"meta_entries_omitted,omitempty"`
	Attached    uint64         `json:"clients_attached_total"`
	Reclaim     uint64         `json:"clients_reclaimed_total"`
	Denied      uint64         `json:"clients_denied_total"`
	Clients     []ClientStatus `json:"clients"`
}

// PoolQPs counts the node's shared physical QPs of one type.
type PoolQPs struct {
	Type  string `json:"type"`
	Count int    `json:"count"`
}

// ClientStatus describes one attached client.
type ClientStatus struct {
	ID          uint64     `json:"id"`
	PID         int32      `json:"pid"`
	UID         uint32     `json:"uid"`
	GID         uint32     `json:"gid"`
	MRs         int        `json:"mrs"`
	MRBytes     int64      `json:"mr_bytes"`
	Regions     int        `json:"regions"`
	Exports     []string   `json:"exports"`
	VQs         []VQStatus `json:"vqs"`
	Pushes      uint64     `json:"pushes"`
	Completions uint64     `json:"completions"`
	Refusals    uint64     `json:"refusals"`
	Calls       uint64     `json:"calls"`
	RingCalls   uint64     `json:"ring_calls"` // control SQEs (Connect) on the VQs' rings
	Naps        uint64     `json:"naps"`       // times its pump was paced beside an interactive client
}

// VQStatus describes one client VQ.
type VQStatus struct {
	ID          uint64      `json:"id"`
	Node        core.NodeID `json:"node"`
	Port        uint32      `json:"port"`
	Outstanding int         `json:"outstanding"`
}

// Status reports the daemon's state.
func (s *Server) Status() Status {
	st := Status{Node: s.rt.Node(), Socket: s.cfg.Socket, Uptime: time.Since(s.start).Round(time.Second).String(),
		Runtime: s.rt.Stats(), Meta: s.rt.MetaStats(), Attached: s.attached.Load(), Reclaim: s.reclaimed.Load(),
		Denied: s.denied.Load(), QPs: s.rt.PoolQPs(), MetaEntries: s.rt.MetaEntries()}
	dcts := 1
	if st.Runtime.RCOnly {
		dcts = 0
	}
	st.Pool = []PoolQPs{{"dct", dcts}, {"dci", st.Runtime.DCIs}, {"rc", st.Runtime.RCs}}
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

func (ss *session) snapshot() ClientStatus {
	c := ClientStatus{ID: ss.id, PID: ss.cred.Pid, UID: ss.cred.Uid, GID: ss.cred.Gid, Pushes: ss.pushes.Load(),
		Completions: ss.completions.Load(), Refusals: ss.refusals.Load(), Calls: ss.calls.Load(), RingCalls: ss.ringCalls.Load(), Naps: ss.naps.Load(), Exports: []string{}}
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	c.MRs, c.MRBytes, c.Regions = len(ss.mrs), ss.mrBytes, len(ss.regions)
	for name := range ss.exports {
		c.Exports = append(c.Exports, name)
	}
	slices.Sort(c.Exports)
	for _, v := range ss.vqs {
		c.VQs = append(c.VQs, VQStatus{ID: v.id, Node: v.node.Load(), Port: v.port.Load(), Outstanding: v.q.Outstanding()})
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
func encodeStatus(st Status, limit int) ([]byte, error) {
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

// putStats appends core.Stats in the order OpStats documents.
func putStats(r *wire.Msg, s core.Stats) {
	for _, v := range []uint64{s.Connects, s.ColdConnects, s.Refusals, s.Recoveries, s.PostErrors, s.RCBuilt,
		s.RCEvicted, s.Migrations, s.StaleTargets, s.Dropped, uint64(s.DCIs), uint64(s.RCs), uint64(s.VQs)} {
		r.U64(v)
	}
}

// GetStats reads what putStats wrote.
func GetStats(m *wire.Msg) core.Stats {
	var s core.Stats
	for _, p := range []*uint64{&s.Connects, &s.ColdConnects, &s.Refusals, &s.Recoveries, &s.PostErrors,
		&s.RCBuilt, &s.RCEvicted, &s.Migrations, &s.StaleTargets, &s.Dropped} {
		*p = m.GetU64()
	}
	s.DCIs, s.RCs, s.VQs = int(m.GetU64()), int(m.GetU64()), int(m.GetU64())
	return s
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
		get             func(*ClientStatus) any
	}{
		{"client_vqs", "gauge", "A client's VQs.", func(c *ClientStatus) any { return len(c.VQs) }},
		{"client_mr_bytes", "gauge", "Bytes a client registered.", func(c *ClientStatus) any { return c.MRBytes }},
		{"client_pushes_total", "counter", "Requests a client pushed.", func(c *ClientStatus) any { return c.Pushes }},
		{"client_completions_total", "counter", "Completions delivered to a client.", func(c *ClientStatus) any { return c.Completions }},
		{"client_refusals_total", "counter", "A client's refused requests.", func(c *ClientStatus) any { return c.Refusals }},
		{"client_naps_total", "counter", "Times a client's pump was paced beside an interactive client.", func(c *ClientStatus) any { return c.Naps }},
	}
	for _, m := range perClient {
		metric(m.name, m.typ, m.help, nil, "client")
		for i := range st.Clients {
			c := &st.Clients[i]
			fmt.Fprintf(w, "krcored_%s{client=\"%d\",pid=\"%d\",uid=\"%d\"} %v\n", m.name, c.ID, c.PID, c.UID, m.get(c))
		}
	}
}
