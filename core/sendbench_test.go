package core_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// BenchmarkSendRoundTrip compares a 64 B SEND round trip between two VQs
// of a two-node in-process cluster (bound ports, the echo answering through
// its VQ) with one between two raw RC QPs of the same soft RNICs, each side
// polling for 200 us with yields and then waiting, as krbench's in-process
// vq test does. p50-ns is the median round trip.
func BenchmarkSendRoundTrip(b *testing.B) {
	const size = 64
	poll := vqrun.Poll{Spin: 200 * time.Microsecond, Yield: true}
	b.Run("vq", func(b *testing.B) {
		c := benchCluster(b)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		echo, err := vqrun.NewEcho(core.Embed(c.Node(2)), 7, poll)
		if err != nil {
			b.Fatal(err)
		}
		defer echo.Close()
		ping, err := vqrun.NewPing(ctx, core.Embed(c.Node(1)), 8, 2, 7, poll)
		if err != nil {
			b.Fatal(err)
		}
		defer ping.Close()
		served := make(chan error, 1)
		go func() { served <- echo.Serve(ctx, 10000+b.N, 10*time.Second) }()
		if _, err := ping.Run(ctx, size, 10000, 0, 10*time.Second); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		d, err := ping.Run(ctx, size, 0, b.N, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := <-served; err != nil {
			b.Fatal(err)
		}
		reportP50(b, d)
	})
	b.Run("raw", func(b *testing.B) {
		c := benchCluster(b)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sh := rawqp.Shape{SendDepth: 64, RecvDepth: 64}
		x, err := rawqp.NewEndpoint(c.Devices[0], nil, size, sh)
		if err != nil {
			b.Fatal(err)
		}
		defer x.Close()
		y, err := rawqp.NewEndpoint(c.Devices[1], nil, size, sh)
		if err != nil {
			b.Fatal(err)
		}
		defer y.Close()
		for _, e := range [][2]*rawqp.Endpoint{{x, y}, {y, x}} {
			if err := e[0].Connect(e[1].QP.Endpoint()); err != nil {
				b.Fatal(err)
			}
			if err := e[0].PostRecvs(32); err != nil {
				b.Fatal(err)
			}
		}
		px := rawqp.NewPoller(ctx, x.CQ, poll.Spin, 10*time.Second, poll.Yield)
		defer px.Close()
		py := rawqp.NewPoller(ctx, y.CQ, poll.Spin, 10*time.Second, poll.Yield)
		defer py.Close()
		served := make(chan error, 1)
		go func() { served <- y.Echo(py, size, 1000+b.N) }()
		if _, err := x.PingPong(px, size, 1000, 0); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		d, err := x.PingPong(px, size, 0, b.N)
		if err != nil {
			b.Fatal(err)
		}
		if err := <-served; err != nil {
			b.Fatal(err)
		}
		reportP50(b, d)
	})
}

// reportP50 reports the median of d as p50-ns.
func reportP50(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkSendRoundTrip1G is BenchmarkSendRoundTrip's round trip done by
// one goroutine, both sides in turn: the CPU cost of the message path
// (SEND, the echo's receive, its SEND back, the receive), without the
// hand-offs between cores that the two-goroutine round trip adds; vq
// through two bound VQs, raw through two raw RC QPs (a CQ for sends and
// one for receives each). Each loop is a function of its own so that
// callgrind can count one alone (as BenchmarkRead8Loop; toggle
// '*sendTrip1GVQ' or '*sendTrip1GRaw', GODEBUG=asyncpreemptoff=1).
func BenchmarkSendRoundTrip1G(b *testing.B) {
	b.Run("vq", func(b *testing.B) {
		c := benchCluster(b)
		ping, pout := sendEnd(b, c.Node(1), 8, 2, 7)
		echo, eout := sendEnd(b, c.Node(2), 7, 1, 8)
		b.ReportAllocs()
		b.ResetTimer()
		sendTrip1GVQ(b, [2]*core.Queue{ping, echo}, [2]*core.MR{pout, eout})
	})
	b.Run("raw", func(b *testing.B) {
		c := benchCluster(b)
		x, y := rawSendPair(b, c.Devices[0], c.Devices[1])
		b.ReportAllocs()
		b.ResetTimer()
		sendTrip1GRaw(b, [2]rawSendSide{x, y})
	})
}

// sendEnd binds a queue of rt to port, connects it to node to's toPort,
// posts 4 receive buffers and registers 64 B to send from.
func sendEnd(b *testing.B, rt *core.Runtime, port uint32, to krcore.NodeID, toPort uint32) (*core.Queue, *core.MR) {
	ctx := context.Background()
	q, err := rt.Queue()
	if err != nil {
		b.Fatal(err)
	}
	if err := q.Bind(port); err != nil {
		b.Fatal(err)
	}
	if err := q.Connect(ctx, to, &krcore.ConnectOptions{Port: toPort}); err != nil {
		b.Fatal(err)
	}
	in, err := rt.RegMR(4*vqrun.MaxMessage, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 4 {
		if err := q.PushRecv(in.Range(i*vqrun.MaxMessage, vqrun.MaxMessage)); err != nil {
			b.Fatal(err)
		}
	}
	out, err := rt.RegMR(64, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	return q, out
}

// sendTrip1GVQ does b.N round trips of 64 B between q[0] and q[1], sending
// from out[0] and out[1].
//
//go:noinline
func sendTrip1GVQ(b *testing.B, q [2]*core.Queue, out [2]*core.MR) {
	ctx := context.Background()
	var msgs [1]krcore.Message
	var comp [1]krcore.Completion
	for i := 0; i < b.N; i++ {
		for s := range 2 {
			if err := q[s].PushOne(ctx, false, krcore.Request{Op: verbs.OpSend, Local: out[s].Range(0, 64)}); err != nil {
				b.Fatal(err)
			}
			for q[s].Pop(comp[:]) == 0 {
			}
			if err := comp[0].Err(); err != nil {
				b.Fatal(err)
			}
			r := q[1-s]
			for r.PopMsgs(msgs[:]) == 0 {
			}
			if err := r.PushRecv(*msgs[0].Buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// rawSendSide is a raw RC QP with a CQ for its sends and one for its
// receives, its 64 B SEND and a receive of its whole MR.
type rawSendSide struct {
	qp       verbs.QP
	scq, rcq verbs.CQ
	send     []verbs.SendWR
	recv     []verbs.RecvWR
}

// rawSendPair connects two RC QPs for SEND round trips and posts 4
// receives on each.
func rawSendPair(b *testing.B, da, db verbs.Device) (rawSendSide, rawSendSide) {
	mk := func(d verbs.Device) rawSendSide {
		pd, _ := d.AllocPD()
		scq, _ := d.CreateCQ(64)
		rcq, _ := d.CreateCQ(64)
		qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: scq, RecvCQ: rcq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
		if err != nil {
			b.Fatal(err)
		}
		blk, _ := offheap.Alloc(4096)
		mr, _ := pd.RegMR(blk.Bytes(), verbs.AccessAll)
		b.Cleanup(func() {
			qp.Close()
			mr.Close()
			scq.Close()
			rcq.Close()
			pd.Close()
			blk.Close()
		})
		return rawSendSide{qp: qp, scq: scq, rcq: rcq,
			send: []verbs.SendWR{{Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 64)}}},
			recv: []verbs.RecvWR{{SGL: []verbs.SGE{verbs.SGEOf(mr, 0, mr.Len())}}}}
	}
	x, y := mk(da), mk(db)
	if err := verbs.Connect(x.qp, y.qp.Endpoint(), verbs.Path{}); err != nil {
		b.Fatal(err)
	}
	if err := verbs.Connect(y.qp, x.qp.Endpoint(), verbs.Path{}); err != nil {
		b.Fatal(err)
	}
	for _, s := range []rawSendSide{x, y} {
		for range 4 {
			if _, err := s.qp.PostRecv(s.recv); err != nil {
				b.Fatal(err)
			}
		}
	}
	return x, y
}

// sendTrip1GRaw does b.N round trips of 64 B between the raw QPs of s.
//
//go:noinline
func sendTrip1GRaw(b *testing.B, s [2]rawSendSide) {
	var wc [1]verbs.WC
	poll := func(cq verbs.CQ) {
		for {
			n, err := cq.Poll(wc[:])
			if err != nil {
				b.Fatal(err)
			}
			if n > 0 {
				break
			}
		}
		if wc[0].Status != verbs.Success {
			b.Fatal(wc[0].Status)
		}
	}
	for i := 0; i < b.N; i++ {
		for k := range 2 {
			if _, err := s[k].qp.PostSend(s[k].send); err != nil {
				b.Fatal(err)
			}
			poll(s[k].scq)
			r := s[1-k]
			poll(r.rcq)
			if _, err := r.qp.PostRecv(r.recv); err != nil {
				b.Fatal(err)
			}
		}
	}
}
