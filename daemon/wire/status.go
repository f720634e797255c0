package wire

import (
	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
)

// Status is the body of OpStatus's response, as JSON: a snapshot of the
// daemon, what krctl shows.
type Status struct {
	Node    krcore.NodeID    `json:"node"`
	Socket  string           `json:"socket"`
	Uptime  string           `json:"uptime"`
	Runtime krcore.Stats     `json:"runtime"`
	Meta    meta.ClientStats `json:"meta_cache"`
	// MetaServers are the MetaServers the runtime reads from (meta.Info
	// text), in the order it tries them; MetaSource says where their
	// records come from (core.Runtime.MetaSource: "embedded" or the etcd).
	MetaServers []string `json:"meta_servers"`
	MetaSource  string   `json:"meta_source"`
	// Pool counts the shared QPs in service by type: the DCT (none
	// without DC), the DCIs and the RC QPs in their peers' pools.
	Pool []PoolQPs `json:"pool"`
	// QPs lists the shared QPs one by one (core.Runtime.PoolQPs),
	// including RC QPs entering or leaving the pool, which Pool does not
	// count.
	QPs []QPStatus `json:"qps"`
	// MetaEntries lists the meta cache's records (core.Runtime.MetaEntries).
	MetaEntries []meta.CacheEntry `json:"meta_entries"`
	// QPsOmitted and MetaOmitted count rows left out of QPs and
	// MetaEntries because the status would not fit a wire message.
	QPsOmitted  int    `json:"qps_omitted,omitempty"`
	MetaOmitted int    `json:"meta_entries_omitted,omitempty"`
	Attached    uint64 `json:"clients_attached_total"`
	Reclaim     uint64 `json:"clients_reclaimed_total"`
	Denied      uint64 `json:"clients_denied_total"`
	// Clients lists the attached clients; a client of a user other than
	// root and the daemon's sees only its own user's here, and the others
	// counted in ClientsHidden.
	Clients       []ClientStatus `json:"clients"`
	ClientsHidden int            `json:"clients_hidden,omitempty"`
}

// PoolQPs counts the node's shared physical QPs of one type.
type PoolQPs struct {
	Type  string `json:"type"`
	Count int    `json:"count"`
}

// QPStatus is one shared physical QP in the status document: the fields
// of the runtime's core.PoolQP, under the same JSON keys, so that the
// protocol, and client and krctl with it, does not depend on the runtime.
type QPStatus struct {
	Type      string        `json:"type"` // dct, dci or rc
	QPN       uint32        `json:"qpn"`
	Peer      krcore.NodeID `json:"peer,omitempty"`
	RemoteQPN uint32        `json:"remote_qpn,omitempty"`
	State     string        `json:"state"` // ready, connecting, draining ...
	VQs       int           `json:"vqs"`
	InFlight  int           `json:"inflight"`
	Queued    int           `json:"queued"`
	Posted    uint64        `json:"posted"`
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
	ID          uint64        `json:"id"`
	Node        krcore.NodeID `json:"node"`
	Port        uint32        `json:"port"`
	Outstanding int           `json:"outstanding"`
}

// PutStats appends s as OpStats's response body: its counters as u64s in
// the order GetStats reads them.
func PutStats(r *Msg, s krcore.Stats) {
	for _, v := range []uint64{s.Connects, s.ColdConnects, s.Refusals, s.Recoveries, s.PostErrors, s.RCBuilt,
		s.RCEvicted, s.Migrations, s.StaleTargets, s.Dropped, uint64(s.DCIs), uint64(s.RCs), uint64(s.VQs)} {
		r.U64(v)
	}
}

// GetStats reads what PutStats wrote.
func GetStats(m *Msg) krcore.Stats {
	var s krcore.Stats
	for _, p := range []*uint64{&s.Connects, &s.ColdConnects, &s.Refusals, &s.Recoveries, &s.PostErrors,
		&s.RCBuilt, &s.RCEvicted, &s.Migrations, &s.StaleTargets, &s.Dropped} {
		*p = m.GetU64()
	}
	s.DCIs, s.RCs, s.VQs = int(m.GetU64()), int(m.GetU64()), int(m.GetU64())
	return s
}
