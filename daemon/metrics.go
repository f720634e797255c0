package daemon

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is the daemon's Prometheus registry, its own rather than the
// process's global one, so several servers (in tests, in krbench) each
// show their own.
type metrics struct {
	reg *prometheus.Registry
	// connectOK and connectFailed observe VQ Connects, see newMetrics.
	connectOK, connectFailed prometheus.Observer
	// gone adds up the request histograms of the clients that detached,
	// so krcored_request_seconds never goes back; Server.mu guards it.
	gone [reqClasses]latencySum
}

// newMetrics makes s's registry: the runtime's and the clients' counters
// and the request histograms, read from s at each scrape (collector); the
// Connect histogram; the process's and the Go runtime's collectors.
func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	connects := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "krcored", Name: "connect_seconds",
		Help: "Time of a VQ Connect the daemon served, on the control socket or the VQ's ring: a warm " +
			"one is a cache lookup (microseconds), a cold one reads the MetaServer; failed ones (result=\"error\") " +
			"include those that ran out the call timeout.",
		Buckets: latencyBounds()}, []string{"result"})
	m.connectOK, m.connectFailed = connects.WithLabelValues("ok"), connects.WithLabelValues("error")
	m.reg.MustRegister(connects, newCollector(s), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeConnect counts a Connect that began at start and ended with err.
func (m *metrics) observeConnect(start time.Time, err error) {
	o := m.connectOK
	if err != nil {
		o = m.connectFailed
	}
	o.Observe(time.Since(start).Seconds())
}

// retire keeps the request histograms of ss, whose client detached and
// whose pump has stopped; Server.mu held, as ss leaves s.sessions.
func (m *metrics) retire(ss *session) {
	for i := range m.gone {
		m.gone[i].add(&ss.lat[i])
	}
}

// MetricsHandler serves the daemon's metrics in Prometheus' exposition
// formats: the node's and every attached client's counters, the latency
// histograms (krcored_connect_seconds, krcored_request_seconds,
// krcored_client_request_seconds) and the process's and Go runtime's
// collectors (process_*, go_*).
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError)})
}

// clientLatency is an attached client's request histogram, summed over
// its classes.
type clientLatency struct {
	id       uint64
	pid, uid string
	lat      latencySum
}

// latencies adds up the request histograms: by class over every client,
// attached or gone, and by attached client.
func (s *Server) latencies() (byClass [reqClasses]latencySum, byClient []clientLatency) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byClass = s.metrics.gone
	for _, ss := range s.sessions {
		c := clientLatency{id: ss.id, pid: strconv.Itoa(int(ss.cred.Pid)), uid: strconv.Itoa(int(ss.cred.Uid))}
		for i := range byClass {
			var one latencySum
			one.add(&ss.lat[i])
			byClass[i].addSum(&one)
			c.lat.addSum(&one)
		}
		byClient = append(byClient, c)
	}
	return byClass, byClient
}
