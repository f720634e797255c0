package daemon

import (
	"strconv"

	"github.com/krcore/krcore/daemon/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// collector reads the daemon's metrics from the runtime and the sessions
// at each scrape: the counters are the runtime's and the sessions' own
// (Server.Status), and the request histograms the pumps' (latencies), so
// nothing is counted twice. A client's series are those of the clients
// attached at the scrape: they go when it detaches.
type collector struct {
	s       *Server
	node    []nodeMetric
	client  []clientMetric
	poolQPs *prometheus.Desc
	// request is by class over every client; clientRequest by attached client.
	request, clientRequest *prometheus.Desc
	smc                    *smcMetrics // the SMC Nodes' reports
}

// nodeMetric is one of the node's counters or gauges, read from a Status.
type nodeMetric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	val  func(*wire.Status) float64
}

// clientMetric is one of an attached client's counters or gauges.
type clientMetric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	val  func(*wire.ClientStatus) float64
}

// clientLabels name an attached client: its id, unique while the daemon
// runs, and its process's pid and uid (fixed for the id, so they add no
// series).
var clientLabels = []string{"client", "pid", "uid"}

func newCollector(s *Server) *collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("krcored_"+name, help, labels, nil)
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	node := func(name string, typ prometheus.ValueType, help string, val func(*wire.Status) float64) nodeMetric {
		return nodeMetric{desc(name, help), typ, val}
	}
	client := func(name string, typ prometheus.ValueType, help string, val func(*wire.ClientStatus) float64) clientMetric {
		return clientMetric{desc(name, help, clientLabels...), typ, val}
	}
	return &collector{s: s, smc: newSMCMetrics(),
		node: []nodeMetric{
			node("vqs", gauge, "Virtual queues on the node (daemon and its own).", func(st *wire.Status) float64 { return float64(st.Runtime.VQs) }),
			node("connects_total", counter, "VQ connects.", func(st *wire.Status) float64 { return float64(st.Runtime.Connects) }),
			node("cold_connects_total", counter, "Connects that read the MetaServer.", func(st *wire.Status) float64 { return float64(st.Runtime.ColdConnects) }),
			node("meta_cache_hits_total", counter, "Meta cache hits.", func(st *wire.Status) float64 { return float64(st.Meta.Hits) }),
			node("meta_cache_misses_total", counter, "Meta cache misses.", func(st *wire.Status) float64 { return float64(st.Meta.Misses) }),
			node("meta_cache_entries", gauge, "Records in the meta cache.", func(st *wire.Status) float64 { return float64(len(st.MetaEntries)) }),
			node("refusals_total", counter, "Requests refused by protection.", func(st *wire.Status) float64 { return float64(st.Runtime.Refusals) }),
			node("recoveries_total", counter, "Shared QPs recovered after an error.", func(st *wire.Status) float64 { return float64(st.Runtime.Recoveries) }),
			node("post_errors_total", counter, "Posts to a shared QP that failed.", func(st *wire.Status) float64 { return float64(st.Runtime.PostErrors) }),
			node("rc_built_total", counter, "RC QPs built for the pool.", func(st *wire.Status) float64 { return float64(st.Runtime.RCBuilt) }),
			node("rc_evicted_total", counter, "RC QPs evicted from the pool.", func(st *wire.Status) float64 { return float64(st.Runtime.RCEvicted) }),
			node("migrations_total", counter, "VQ moves between DC and RC.", func(st *wire.Status) float64 { return float64(st.Runtime.Migrations) }),
			node("peers_dead_total", counter, "Times a peer was found dead.", func(st *wire.Status) float64 { return float64(st.Runtime.PeersDead) }),
			node("clients", gauge, "Attached clients.", func(st *wire.Status) float64 { return float64(len(st.Clients)) }),
			node("clients_attached_total", counter, "Clients attached.", func(st *wire.Status) float64 { return float64(st.Attached) }),
			node("clients_reclaimed_total", counter, "Clients gone and reclaimed.", func(st *wire.Status) float64 { return float64(st.Reclaim) }),
			node("clients_denied_total", counter, "Peers refused by uid/gid.", func(st *wire.Status) float64 { return float64(st.Denied) }),
		},
		client: []clientMetric{
			client("client_vqs", gauge, "A client's VQs.", func(c *wire.ClientStatus) float64 { return float64(len(c.VQs)) }),
			client("client_mr_bytes", gauge, "Bytes a client registered.", func(c *wire.ClientStatus) float64 { return float64(c.MRBytes) }),
			client("client_pushes_total", counter, "Requests a client pushed.", func(c *wire.ClientStatus) float64 { return float64(c.Pushes) }),
			client("client_completions_total", counter, "Completions delivered to a client.", func(c *wire.ClientStatus) float64 { return float64(c.Completions) }),
			client("client_refusals_total", counter, "A client's refused requests.", func(c *wire.ClientStatus) float64 { return float64(c.Refusals) }),
			client("client_calls_total", counter, "A client's control calls on the socket.", func(c *wire.ClientStatus) float64 { return float64(c.Calls) }),
			client("client_ring_calls_total", counter, "A client's control requests (Connect) on its VQs' rings.", func(c *wire.ClientStatus) float64 { return float64(c.RingCalls) }),
			client("client_naps_total", counter, "Times a client's pump was paced beside an interactive client.", func(c *wire.ClientStatus) float64 { return float64(c.Naps) }),
		},
		poolQPs: desc("pool_qps", "Shared physical QPs by type.", "type"),
		request: desc("request_seconds", "Time of a request through the daemon, from its client's pump taking it off "+
			"the VQ's submission ring to its completion posted on the completion ring, by opcode and size (bytes "+
			"moved: up to 64 B, such as the 8 B READ, up to 4 KiB, larger), over every client since the daemon started.",
			"op", "size"),
		clientRequest: desc("client_request_seconds", "Time of an attached client's requests through the daemon, "+
			"as krcored_request_seconds, all opcodes and sizes.", clientLabels...),
	}
}

// Describe sends every metric's description.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.node {
		ch <- m.desc
	}
	for _, m := range c.client {
		ch <- m.desc
	}
	ch <- c.poolQPs
	ch <- c.request
	ch <- c.clientRequest
	c.smc.describe(ch)
}

// Collect reads the daemon's state and sends its metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Status()
	for _, m := range c.node {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.val(&st))
	}
	for _, p := range st.Pool {
		ch <- prometheus.MustNewConstMetric(c.poolQPs, prometheus.GaugeValue, float64(p.Count), p.Type)
	}
	for i := range st.Clients {
		cs := &st.Clients[i]
		id, pid, uid := strconv.FormatUint(cs.ID, 10), strconv.Itoa(int(cs.PID)), strconv.Itoa(int(cs.UID))
		for _, m := range c.client {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.val(cs), id, pid, uid)
		}
	}
	byClass, byClient := c.s.latencies()
	for i := range byClass {
		if byClass[i] == (latencySum{}) {
			continue // a class no request fell in: no series
		}
		op, size := classLabels(i)
		ch <- byClass[i].metric(c.request, op, size)
	}
	for _, cl := range byClient {
		ch <- cl.lat.metric(c.clientRequest, strconv.FormatUint(cl.id, 10), cl.pid, cl.uid)
	}
	c.smc.collect(c.s, ch)
}
