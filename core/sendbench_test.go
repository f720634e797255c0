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

// BenchmarkSendRoundTrip1G is BenchmarkSendRoundTrip's VQ round trip done
// by one goroutine, both sides in turn: the CPU cost of the message path
// (SEND, the echo's receive, its SEND back, the receive), without the
// hand-offs between cores that the two-goroutine round trip adds.
func BenchmarkSendRoundTrip1G(b *testing.B) {
	c := benchCluster(b)
	ctx := context.Background()
	end := func(rt *core.Runtime, port uint32, to krcore.NodeID, toPort uint32) (*core.Queue, *core.MR) {
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
	ping, pout := end(c.Node(1), 8, 2, 7)
	echo, eout := end(c.Node(2), 7, 1, 8)
	var msgs [1]krcore.Message
	var comp [1]krcore.Completion
	send := func(q *core.Queue, out *core.MR) {
		if _, err := q.Push(ctx, false, krcore.Request{Op: verbs.OpSend, Local: out.Range(0, 64)}); err != nil {
			b.Fatal(err)
		}
		for q.Pop(comp[:]) == 0 {
		}
		if err := comp[0].Err(); err != nil {
			b.Fatal(err)
		}
	}
	recv := func(q *core.Queue) {
		for q.PopMsgs(msgs[:]) == 0 {
		}
		if err := q.PushRecv(*msgs[0].Buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		send(ping, pout)
		recv(echo)
		send(echo, eout)
		recv(ping)
	}
}
