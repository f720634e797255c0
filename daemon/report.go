package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/smc"
	"github.com/krcore/krcore/verbs"
	"github.com/prometheus/client_golang/prometheus"
)

// storedReport is a client's report as the daemon keeps it.
type storedReport struct {
	body []byte
	at   time.Time
}

// report keeps (or, with an empty body, withdraws) one of the client's
// reports: a name of printable ASCII without spaces, a JSON body of at
// most wire.MaxReport bytes, at most wire.MaxReports of them.
func (ss *session) report(m *wire.Msg) error {
	name, body := m.GetStr(), m.GetStr()
	if err := m.Err(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := checkReportName(name); err != nil {
		return err
	}
	if len(body) > wire.MaxReport || (body != "" && !json.Valid([]byte(body))) {
		return fmt.Errorf("report %s: a body of %d bytes that is not JSON or over %d: %w", name, len(body), wire.MaxReport, verbs.ErrInvalid)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if body == "" {
		delete(ss.reports, name)
		return nil
	}
	if _, ok := ss.reports[name]; !ok && len(ss.reports) >= wire.MaxReports {
		return fmt.Errorf("report %s: the client keeps %d reports already: %w", name, wire.MaxReports, verbs.ErrLimit)
	}
	ss.reports[name] = storedReport{body: []byte(body), at: time.Now()}
	return nil
}

func checkReportName(name string) error {
	ok := name != "" && len(name) <= wire.MaxReportName
	for i := 0; ok && i < len(name); i++ {
		ok = name[i] > ' ' && name[i] < 0x7f
	}
	if !ok {
		return fmt.Errorf("report name %q: want 1-%d printable characters: %w", name, wire.MaxReportName, verbs.ErrInvalid)
	}
	return nil
}

// Reports lists the attached clients' reports whose names start with
// prefix, by client and name.
func (s *Server) Reports(prefix string) []wire.Report {
	now := time.Now()
	var out []wire.Report
	for _, ss := range s.sessionList() {
		ss.mu.RLock()
		for name, r := range ss.reports {
			if strings.HasPrefix(name, prefix) {
				out = append(out, wire.Report{Client: ss.id, PID: ss.cred.Pid, UID: ss.cred.Uid, Name: name,
					Age: now.Sub(r.at), Body: r.body})
			}
		}
		ss.mu.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Client != out[j].Client {
			return out[i].Client < out[j].Client
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// reportsVisibleTo is rs as a client of user uid sees them through
// OpReports, the daemon running as user owner: those it may see (sees),
// as for the status's clients.
func reportsVisibleTo(rs []wire.Report, uid, owner uint32) []wire.Report {
	return slices.DeleteFunc(rs, func(r wire.Report) bool { return !sees(uid, owner, r.UID) })
}

// listReports answers OpReports: the reports from the skip-th on, as many as
// fit a message; the total tells the client whether to ask again.
func (ss *session) listReports(m *wire.Msg, r *wire.Msg) error {
	prefix, skip := m.GetStr(), m.GetU32()
	if err := m.Err(); err != nil {
		return fmt.Errorf("reports: %w", err)
	}
	all := reportsVisibleTo(ss.s.Reports(prefix), ss.cred.Uid, uint32(os.Geteuid()))
	r.U32(uint32(len(all)))
	if int(skip) >= len(all) {
		r.U32(0)
		return nil
	}
	rest := all[skip:]
	room, k := wire.MaxMessage-wire.HeaderLen-8, 0
	for k < len(rest) && wire.ReportSize(&rest[k]) <= room {
		room -= wire.ReportSize(&rest[k])
		k++
	}
	r.U32(uint32(k))
	for i := range rest[:k] {
		wire.PutReport(r, &rest[i])
	}
	return nil
}

// smcLabels name an SMC Node's series: its client and the Node's port
// (its report's name after "smc/").
var smcLabels = []string{"client", "pid", "uid", "port"}

// smcCounter is one of an SMC Node's counters as krcored_smc_* exports it.
type smcCounter struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	val  func(*smc.Report) float64
}

// smcMetrics are the series of the SMC Nodes' reports (package smc's
// Report, under the names smc.ReportName gives): what krctl smc prints.
type smcMetrics struct {
	counters        []smcCounter
	open, fallbacks *prometheus.Desc
}

func newSMCMetrics() *smcMetrics {
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("krcored_smc_"+name, help, append(slices.Clone(smcLabels), extra...), nil)
	}
	c := func(name, help string, typ prometheus.ValueType, val func(*smc.Report) float64) smcCounter {
		return smcCounter{desc(name, help), typ, val}
	}
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	return &smcMetrics{
		counters: []smcCounter{
			c("connections_total", "Connections of an SMC Node that settled on SMC.", counter, func(r *smc.Report) float64 { return float64(r.Stats.SMC) }),
			c("sent_bytes_total", "Bytes an SMC Node's connections wrote over SMC.", counter, func(r *smc.Report) float64 { return float64(r.Stats.BytesSent) }),
			c("received_bytes_total", "Bytes an SMC Node's connections read over SMC.", counter, func(r *smc.Report) float64 { return float64(r.Stats.BytesReceived) }),
			c("rdma_writes_total", "RDMA WRITE_WITH_IMMs that carried an SMC Node's bytes.", counter, func(r *smc.Report) float64 { return float64(r.Stats.Writes) }),
			c("cursor_messages_total", "CDC messages (window updates, close flags) an SMC Node sent.", counter, func(r *smc.Report) float64 { return float64(r.Stats.CursorMsgs) }),
			c("lookups_total", "Lookups of peers' buffer slabs.", counter, func(r *smc.Report) float64 { return float64(r.Stats.Lookups) }),
			c("dropped_total", "Notifications naming no connection of the Node.", counter, func(r *smc.Report) float64 { return float64(r.Stats.Dropped) }),
			c("slabs", "Registered slabs of receive buffers (16 buffers, or 1 MiB of larger ones, each).", gauge, func(r *smc.Report) float64 { return float64(r.Stats.Slabs) }),
			c("buffer_memory_bytes", "An SMC Node's registered buffer memory, receive and staging.", gauge, func(r *smc.Report) float64 { return float64(r.Stats.Memory) }),
			c("buffer_grows_total", "Larger receive buffers an SMC Node offered its peers (a stream).", counter, func(r *smc.Report) float64 { return float64(r.Stats.Grows) }),
			c("buffer_shrinks_total", "Smaller receive buffers an SMC Node offered its peers (an idle connection).", counter, func(r *smc.Report) float64 { return float64(r.Stats.Shrinks) }),
		},
		open:      desc("open_connections", "An SMC Node's open connections by mode (SMC, TCP, pending).", "mode"),
		fallbacks: desc("fallbacks_total", "Connections of an SMC Node that fell back to TCP, by reason.", "reason"),
	}
}

func (m *smcMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.counters {
		ch <- c.desc
	}
	ch <- m.open
	ch <- m.fallbacks
}

// collect sends the series of every attached client's SMC reports; a
// report that does not parse as one is left out.
func (m *smcMetrics) collect(s *Server, ch chan<- prometheus.Metric) {
	for _, wr := range s.Reports("smc/") {
		var r smc.Report
		if json.Unmarshal(wr.Body, &r) != nil {
			continue
		}
		// The port from the name, not the body: names are unique per
		// client, so no two reports give the same series.
		labels := []string{strconv.FormatUint(wr.Client, 10), strconv.Itoa(int(wr.PID)), strconv.Itoa(int(wr.UID)),
			strings.TrimPrefix(wr.Name, "smc/")}
		for _, c := range m.counters {
			ch <- prometheus.MustNewConstMetric(c.desc, c.typ, c.val(&r), labels...)
		}
		open := map[string]int{"SMC": 0, "TCP": 0, "pending": 0}
		for _, ci := range r.Conns {
			if _, ok := open[ci.Mode]; ok {
				open[ci.Mode]++
			}
		}
		for mode, k := range open {
			ch <- prometheus.MustNewConstMetric(m.open, prometheus.GaugeValue, float64(k), append(labels, mode)...)
		}
		for reason, k := range r.Stats.Fallbacks {
			ch <- prometheus.MustNewConstMetric(m.fallbacks, prometheus.CounterValue, float64(k), append(labels, reason.Text())...)
		}
	}
}
