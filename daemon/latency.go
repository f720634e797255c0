package daemon

import (
	"math"
	"math/bits"
	"sync/atomic"

	"github.com/krcore/krcore/verbs"
	"github.com/prometheus/client_golang/prometheus"
)

// The latency histograms' buckets: powers of two of nanoseconds, from
// 2^latencyMinShift (1.024 µs, below any request through the daemon) over
// latencyBuckets bounds to 2^33 ns (8.6 s, past the default call timeout
// of 5 s that bounds a Connect).
const (
	latencyMinShift = 10
	latencyBuckets  = 24
)

// latencyBounds is the upper bounds of the latency buckets, in seconds.
func latencyBounds() []float64 {
	b := make([]float64, latencyBuckets)
	for i := range b {
		b[i] = math.Ldexp(1, latencyMinShift+i) / 1e9
	}
	return b
}

// latency is a histogram of durations over latencyBounds, cheap enough
// for the pump's hot path: observe finds the bucket with one bit count and
// bumps two counters with atomic loads and stores, no locked instruction,
// because its writers are serialised (the pump's lock). A scrape reads the
// counters with atomic loads, at any time.
type latency struct {
	counts [latencyBuckets + 1]atomic.Uint64 // not cumulative; the last is beyond every bound
	sum    atomic.Uint64                     // nanoseconds
}

// observe counts a duration of ns nanoseconds. One writer at a time.
func (l *latency) observe(ns int64) {
	ns = max(ns, 1)
	c := &l.counts[min(max(bits.Len64(uint64(ns-1))-latencyMinShift, 0), latencyBuckets)]
	c.Store(c.Load() + 1)
	l.sum.Store(l.sum.Load() + uint64(ns))
}

// latencySum is latency histograms added up, for a scrape or kept for
// the clients that are gone.
type latencySum struct {
	counts [latencyBuckets + 1]uint64
	sum    uint64
}

// add adds l's counts.
func (t *latencySum) add(l *latency) {
	for i := range t.counts {
		t.counts[i] += l.counts[i].Load()
	}
	t.sum += l.sum.Load()
}

// addSum adds o's counts.
func (t *latencySum) addSum(o *latencySum) {
	for i := range t.counts {
		t.counts[i] += o.counts[i]
	}
	t.sum += o.sum
}

// metric is t as a Prometheus histogram of desc with the label values
// given.
func (t *latencySum) metric(desc *prometheus.Desc, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, latencyBuckets)
	n := uint64(0)
	for i, bound := range latencyBounds() {
		n += t.counts[i]
		buckets[bound] = n
	}
	n += t.counts[latencyBuckets]
	return prometheus.MustNewConstHistogram(desc, n, float64(t.sum)/1e9, buckets, labels...)
}

// A request's class, the labels of krcored_request_seconds: its opcode
// and its size, up to 64 B (a cache line: the 8 B READ that krbench's
// daemon-read measures and KRCore's figures quote), up to a page, or
// larger.
var (
	opNames = [...]string{verbs.OpSend: "send", verbs.OpSendImm: "send_imm", verbs.OpWrite: "write",
		verbs.OpWriteImm: "write_imm", verbs.OpRead: "read", verbs.OpCompareSwap: "cas", verbs.OpFetchAdd: "faa"}
	sizeNames = [...]string{"<=64B", "<=4KiB", ">4KiB"}
)

// reqClasses is how many classes requests fall in; class 0..len(sizeNames)-1
// hold the opcodes that are not valid ("other").
const reqClasses = len(opNames) * len(sizeNames)

// reqClass is the class of a request of opcode op moving n bytes.
func reqClass(op verbs.Opcode, n int) uint8 {
	size := 2
	switch {
	case n <= 64:
		size = 0
	case n <= 4096:
		size = 1
	}
	if !op.Valid() {
		op = 0
	}
	return uint8(int(op)*len(sizeNames) + size)
}

// classLabels is the op and size labels of class i.
func classLabels(i int) (op, size string) {
	op = opNames[i/len(sizeNames)]
	if op == "" {
		op = "other"
	}
	return op, sizeNames[i%len(sizeNames)]
}

// stamp is when the pump took a request off its VQ's submission ring, kept
// until the request's completion is posted (vq.sent).
type stamp struct {
	tag   uint64 // the request's SQE sequence number + 1; 0: free
	at    int64  // Server.clock
	class uint8
}

// sent records that the request of SQE seq, of class class, left the ring
// at now.
func (v *vq) sent(seq uint64, now int64, class uint8) {
	v.stamps[seq%uint64(len(v.stamps))] = stamp{tag: seq + 1, at: now, class: class}
}

// observe counts the time, up to now, of the request of SQE seq whose
// completion is being posted, in its client's histogram of its class. A
// request whose stamp a later one took (more than len(v.stamps) SQEs
// apart) goes uncounted.
func (v *vq) observe(seq uint64, now int64) {
	st := &v.stamps[seq%uint64(len(v.stamps))]
	if st.tag != seq+1 {
		return
	}
	st.tag = 0
	v.ss.lat[st.class].observe(now - st.at)
}
