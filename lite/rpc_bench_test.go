package lite_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// BenchmarkRPC: 8-byte calls from node 1 (embedded and through krcored) to
// an echo service at node 2 (four goroutines serve it), one at a time (the round trip), and from 1
// and 8 goroutines at once (calls/s). BenchmarkSendRoundTrip is the
// baseline of the same run: a raw VQ SEND and its SEND back between the
// same nodes.
func BenchmarkRPC(b *testing.B) {
	serverAPI, callers := apis(b)
	for _, name := range []string{"embedded", "daemon"} {
		ctx := context.Background()
		server, caller := open(b, serverAPI), open(b, callers[name])
		svc := echo(b, server, 1)
		for range 3 { // four goroutines serve, as the callers may be eight
			go serveEcho(svc)
		}
		req, resp := make([]byte, 8), make([]byte, 8)
		if _, err := caller.Call(ctx, 2, 1, req, resp); err != nil { // sets the ring up
			b.Fatal(err)
		}
		b.Run(name+"/8B", func(b *testing.B) {
			var d []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := caller.Call(ctx, 2, 1, req, resp); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
			}
			reportMedian(b, d, "p50-ns") // the mean is at the mercy of a loaded machine's stalls
		})
		for _, callers := range []int{1, 8} {
			b.Run(name+"/callers="+string(rune('0'+callers)), func(b *testing.B) {
				parallelCalls(b, caller, callers)
			})
		}
		server.Close()
		caller.Close()
	}
}

// parallelCalls makes b.N 8-byte calls from callers goroutines and
// reports calls/s.
func parallelCalls(b *testing.B, caller *lite.Node, callers int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			req, resp := make([]byte, 8), make([]byte, 8)
			for i := g; i < b.N; i += callers {
				if _, err := caller.Call(ctx, 2, 1, req, resp); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}

// BenchmarkSendRoundTrip: an 8-byte SEND from node 1 to a VQ bound at node
// 2 and the SEND back, raw VQs, no LITE.
func BenchmarkSendRoundTrip(b *testing.B) {
	serverAPI, callers := apis(b)
	for _, name := range []string{"embedded", "daemon"} {
		b.Run(name+"/8B", func(b *testing.B) {
			sendRoundTrips(b, callers[name], serverAPI)
		})
	}
}

func sendRoundTrips(b *testing.B, api, serverAPI krcore.API) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const port = 0x5a5a
	pingQ, pongQ := vqEnd(b, api, port), vqEnd(b, serverAPI, port)
	ping, pong := msgBuf(b, api), msgBuf(b, serverAPI)
	for _, e := range []struct {
		q    krcore.VQ
		buf  krcore.MR
		node krcore.NodeID
	}{{pingQ, ping, 2}, {pongQ, pong, 1}} {
		if err := e.q.Connect(ctx, e.node, &krcore.ConnectOptions{Port: port}); err != nil {
			b.Fatal(err)
		}
		if err := e.q.PushRecv(e.buf.Range(64, 64)); err != nil {
			b.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { // the echo at node 2
		defer close(done)
		for ctx.Err() == nil {
			if roundTrip(ctx, pongQ, pong, false) != nil {
				return
			}
		}
	}()
	for b.Loop() {
		if err := roundTrip(ctx, pingQ, ping, true); err != nil {
			b.Fatal(err)
		}
	}
	cancel()
	pongQ.Close()
	<-done
}

// roundTrip is one side of a ping-pong: SEND then wait for a message
// (sendFirst), or wait then SEND.
func roundTrip(ctx context.Context, q krcore.VQ, buf krcore.MR, sendFirst bool) error {
	send := func() error {
		if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: buf.Range(0, 8)}); err != nil {
			return err
		}
		var wc [1]krcore.Completion
		if _, err := q.PopWait(ctx, wc[:]); err != nil {
			return err
		}
		return wc[0].Err()
	}
	recv := func() error {
		var m [1]krcore.Message
		if _, err := q.PopMsgsWait(ctx, m[:]); err != nil {
			return err
		}
		return q.PushRecv(*m[0].Buf)
	}
	if sendFirst {
		if err := send(); err != nil {
			return err
		}
		return recv()
	}
	if err := recv(); err != nil {
		return err
	}
	return send()
}

func vqEnd(b *testing.B, api krcore.API, port uint32) krcore.VQ {
	q, err := api.Queue()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { q.Close() })
	if err := q.Bind(port); err != nil {
		b.Fatal(err)
	}
	return q
}

func msgBuf(b *testing.B, api krcore.API) krcore.MR {
	m, err := api.RegMR(128, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { api.Deregister(m) })
	return m
}

// BenchmarkRPCVsWriteImm splits an 8-byte RPC round trip into the
// transport's part and lite's: in rotating blocks of one run, a lite Call
// (rpc), a bare WRITE_WITH_IMM ping-pong between two VQs of the same nodes,
// each side waiting for the other's notification (wimm: what a call and its
// reply carry, without lite), and a SEND round trip (send). p50s in ns.
func BenchmarkRPCVsWriteImm(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serverAPI, callers := apis(b)
	api := callers["embedded"]
	server, caller := open(b, serverAPI), open(b, api)
	svc := echo(b, server, 1)
	go serveEcho(svc) // two serve, as in krbench
	const wimmPort, sendPort = 0x5a5b, 0x5a5c
	ping, pong := wimmEnd(ctx, b, api, 2, wimmPort), wimmEnd(ctx, b, serverAPI, 1, wimmPort)
	ping.aim(ctx, b, 2)
	pong.aim(ctx, b, 1)
	sping, spong := vqEnd(b, api, sendPort), vqEnd(b, serverAPI, sendPort)
	spingBuf, spongBuf := msgBuf(b, api), msgBuf(b, serverAPI)
	for _, e := range []struct {
		q    krcore.VQ
		buf  krcore.MR
		node krcore.NodeID
	}{{sping, spingBuf, 2}, {spong, spongBuf, 1}} {
		if err := e.q.Connect(ctx, e.node, &krcore.ConnectOptions{Port: sendPort}); err != nil {
			b.Fatal(err)
		}
		if err := e.q.PushRecv(e.buf.Range(64, 64)); err != nil {
			b.Fatal(err)
		}
	}
	echoes := make(chan error, 2)
	go func() { // the echoes at node 2
		var err error
		for err == nil {
			if err = pong.recv(ctx); err == nil {
				err = pong.write(ctx)
			}
		}
		echoes <- err
	}()
	go func() {
		var err error
		for err == nil {
			err = roundTrip(ctx, spong, spongBuf, false)
		}
		echoes <- err
	}()
	req, resp := make([]byte, 8), make([]byte, 8)
	ops := []struct {
		name string
		run  func() error
	}{
		{"rpc", func() error { _, err := caller.Call(ctx, 2, 1, req, resp); return err }},
		{"wimm", func() error {
			if err := ping.write(ctx); err != nil {
				return err
			}
			return ping.recv(ctx)
		}},
		{"send", func() error { return roundTrip(ctx, sping, spingBuf, true) }},
	}
	d := make([][]time.Duration, len(ops))
	for b.Loop() {
		for blk := range 10 {
			for k := range ops {
				i := (blk + k) % len(ops)
				for range 200 {
					t0 := time.Now()
					if err := ops[i].run(); err != nil {
						b.Fatalf("%s: %v", ops[i].name, err)
					}
					d[i] = append(d[i], time.Since(t0))
				}
			}
		}
	}
	for i, o := range ops {
		reportMedian(b, d[i], o.name+"-p50-ns")
	}
	cancel()
	pong.q.Close()
	spong.Close()
	<-echoes
	<-echoes
}

// wimmSide is one side of a WRITE_WITH_IMM ping-pong: a VQ bound to the
// port, connected to the peer's, and the request that writes the peer's
// exported target.
type wimmSide struct {
	q   krcore.VQ
	buf krcore.MR
	req [1]krcore.Request
	out [1]krcore.Completion
	msg [1]krcore.Message
}

// wimmEnd makes api's side: its VQ, connected to peer's port, and an
// exported target for peer to write.
func wimmEnd(ctx context.Context, b *testing.B, api krcore.API, peer krcore.NodeID, port uint32) *wimmSide {
	b.Helper()
	target, err := api.RegMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { api.Deregister(target) })
	if err := api.Export(fmt.Sprintf("wimm-%d", api.Node()), target, 0, target.Len(), verbs.AccessRemoteWrite); err != nil {
		b.Fatal(err)
	}
	s := &wimmSide{q: vqEnd(b, api, port), buf: msgBuf(b, api)}
	if err := s.q.Connect(ctx, peer, &krcore.ConnectOptions{Port: port}); err != nil {
		b.Fatal(err)
	}
	return s
}

// aim points s's WRITE at peer's target, once peer exported it.
func (s *wimmSide) aim(ctx context.Context, b *testing.B, peer krcore.NodeID) {
	b.Helper()
	g, err := s.q.Region(ctx, fmt.Sprintf("wimm-%d", peer))
	if err != nil {
		b.Fatal(err)
	}
	s.req[0] = krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: s.buf.Range(0, 8), Remote: g.At(0), Imm: 7}
}

// write WRITE_WITH_IMMs 8 bytes to the peer and waits for the completion.
func (s *wimmSide) write(ctx context.Context) error {
	if _, err := s.q.Push(ctx, true, s.req[:]...); err != nil {
		return err
	}
	if _, err := s.q.PopWait(ctx, s.out[:]); err != nil {
		return err
	}
	return s.out[0].Err()
}

// recv waits for the peer's notification.
func (s *wimmSide) recv(ctx context.Context) error {
	_, err := s.q.PopMsgsWait(ctx, s.msg[:])
	return err
}
