package daemon_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads srv's metrics as a Prometheus server would, and parses them.
func scrape(t *testing.T, srv *daemon.Server) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

// series is the metric of fams named name whose labels include want
// (name, value pairs), or nil.
func series(fams map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			ok = ok && got[want[i]] == want[i+1]
		}
		if ok {
			return m
		}
	}
	return nil
}

// histCount is the count of the histogram series, 0 if it is absent; it
// checks the series is a well-formed histogram: cumulative buckets that
// end at or below its count, a positive sum when it counted anything.
func histCount(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) uint64 {
	t.Helper()
	m := series(fams, name, labels...)
	if m == nil {
		return 0
	}
	h := m.GetHistogram()
	if h == nil {
		t.Fatalf("%s%v: not a histogram", name, labels)
	}
	last := uint64(0)
	for _, b := range h.Bucket {
		if b.GetCumulativeCount() < last {
			t.Errorf("%s%v: buckets not cumulative: %v", name, labels, h.Bucket)
		}
		last = b.GetCumulativeCount()
	}
	if last > h.GetSampleCount() || h.GetSampleCount() > 0 && h.GetSampleSum() <= 0 {
		t.Errorf("%s%v: count %d, sum %g, last bucket %d", name, labels, h.GetSampleCount(), h.GetSampleSum(), last)
	}
	return h.GetSampleCount()
}

// value is the counter's or gauge's value, -1 if the series is absent.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m := series(fams, name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

// TestMetrics scrapes a daemon while a client works: its Connects, 8 B
// READs and an 8 KiB WRITE move the counters and land in the histograms
// of their class and of the client; when the client detaches its series
// go, and the node's request histogram keeps its requests.
func TestMetrics(t *testing.T) {
	c, srv, sock, _ := serveDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mem, _ := c.Node(2).RegMR(8192, verbs.AccessAll)
	c.Node(2).Export("t", mem, 0, 8192, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id := strconv.FormatUint(cl.ID(), 10)

	before := scrape(t, srv)
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if before[name] == nil {
			t.Errorf("no %s: the Go and process collectors are not registered", name)
		}
	}
	if v := value(before, "krcored_clients"); v != 1 {
		t.Errorf("krcored_clients %g, want 1", v)
	}
	if series(before, "krcored_client_request_seconds", "client", id) == nil {
		t.Errorf("no request histogram for attached client %s", id)
	}

	q, _ := cl.Queue()
	for range 2 { // cold, then warm
		if err := q.Connect(ctx, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Connect(ctx, 99, nil); err == nil {
		t.Fatal("connect to node 99, which does not exist: no error")
	}
	g, err := q.Region(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := cl.RegMR(8192, verbs.AccessAll)
	const reads = 100
	do := func(r krcore.Request) {
		t.Helper()
		var out [1]krcore.Completion
		if _, err := q.Push(ctx, true, r); err != nil {
			t.Fatal(err)
		}
		if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			t.Fatal(err, out[0].Err())
		}
	}
	for i := range reads {
		do(krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
	}
	do(krcore.Request{ID: reads, Op: verbs.OpWrite, Local: buf.Range(0, 8192), Remote: g.At(0)})

	after := scrape(t, srv)
	for _, c := range []struct {
		name   string
		labels []string
		want   uint64
	}{
		{"krcored_request_seconds", []string{"op", "read", "size", "<=64B"}, reads},
		{"krcored_request_seconds", []string{"op", "write", "size", ">4KiB"}, 1},
		{"krcored_client_request_seconds", []string{"client", id}, reads + 1},
	} {
		if n := histCount(t, after, c.name, c.labels...); n != c.want {
			t.Errorf("%s%v: %d requests, want %d", c.name, c.labels, n, c.want)
		}
	}
	for _, result := range []string{"ok", "error"} {
		b, a := histCount(t, before, "krcored_connect_seconds", "result", result), histCount(t, after, "krcored_connect_seconds", "result", result)
		if a <= b {
			t.Errorf("krcored_connect_seconds{result=%q}: %d connects, %d before", result, a, b)
		}
	}
	for _, name := range []string{"krcored_client_pushes_total", "krcored_client_completions_total"} {
		if v := value(after, name, "client", id); v != reads+1 {
			t.Errorf("%s: %g, want %d", name, v, reads+1)
		}
	}
	if b, a := value(before, "krcored_connects_total"), value(after, "krcored_connects_total"); a < b+2 {
		t.Errorf("krcored_connects_total %g, %g before: want 2 more", a, b)
	}

	cl.Close()
	for srv.Status().Reclaim == 0 {
		if ctx.Err() != nil {
			t.Fatal("client not reclaimed")
		}
		time.Sleep(time.Millisecond) // polling the condition: reclaim runs in the daemon
	}
	gone := scrape(t, srv)
	for _, name := range []string{"krcored_client_request_seconds", "krcored_client_pushes_total"} {
		if series(gone, name, "client", id) != nil {
			t.Errorf("%s still has detached client %s", name, id)
		}
	}
	if n := histCount(t, gone, "krcored_request_seconds", "op", "read", "size", "<=64B"); n != reads {
		t.Errorf("after the client left: %d READs in krcored_request_seconds, want %d", n, reads)
	}
}
