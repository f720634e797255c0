package core_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// reportCPU reports the process's CPU time (user and system) per
// iteration from now until the benchmark ends, as cpu-ns/op: on a machine
// shared with other work a synchronous loop's wall time per op counts the
// time it waited for a core, its CPU time much less so. Call it right
// before the timed loop.
func reportCPU(b *testing.B) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	start := ru.Utime.Nano() + ru.Stime.Nano()
	b.Cleanup(func() {
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		b.ReportMetric(float64(ru.Utime.Nano()+ru.Stime.Nano()-start)/float64(b.N), "cpu-ns/op")
	})
}

// benchCluster is a two-node in-process cluster with the default
// timeouts, for benchmarks and the tests that count what a request costs
// (allocs_test.go), with the RC pool disabled (VQs stay on DC) unless rc.
// It is closed when b ends.
func benchCluster(b testing.TB, rc ...bool) *cluster.Cluster {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := core.Config{RCPeers: -1}
	if len(rc) > 0 && rc[0] {
		cfg.RCPeers = 0 // the default pool
	}
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2, Runtime: cfg})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// BenchmarkConnectWarm: Connect to a node whose DC target is cached.
func BenchmarkConnectWarm(b *testing.B) {
	c := benchCluster(b)
	a := c.Node(1)
	q, _ := a.Queue()
	defer q.Close()
	ctx := context.Background()
	if err := q.Connect(ctx, 2, nil); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := q.Connect(ctx, 2, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnectWarmParallel: warm connects from every core.
func BenchmarkConnectWarmParallel(b *testing.B) {
	c := benchCluster(b)
	a := c.Node(1)
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		q, _ := a.Queue()
		defer q.Close()
		for pb.Next() {
			if err := q.Connect(ctx, 2, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkConnectCold: Connect to a node the runtime has forgotten: one
// READ of the MetaServer's table plus an address handle.
func BenchmarkConnectCold(b *testing.B) {
	c := benchCluster(b)
	a := c.Node(2) // the MetaServer is embedded in node 1
	q, _ := a.Queue()
	defer q.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := a.Forget(ctx, 1); err != nil {
			b.Fatal(err)
		}
		if err := q.Connect(ctx, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if s := a.Stats(); s.ColdConnects < uint64(b.N) {
		b.Fatalf("%d cold connects for %d iterations", s.ColdConnects, b.N)
	}
}

// BenchmarkRead8TCP compares a sync 8 B READ through a VQ (PopWait) with
// one on a raw QP (CQ.Wait) between two soft RNICs over TCP: vq (on its
// DCI) against raw-dc (a DCI and a DCT of their own), vq-rc (the runtime
// moved the hot peer to an RC QP) against raw (an RC pair). Each pair
// differs only in the runtime, so its ratio is the VQ's cost.
func BenchmarkRead8TCP(b *testing.B) {
	b.Run("vq", func(b *testing.B) { benchVQReadTCP(b, false) })
	b.Run("vq-rc", func(b *testing.B) { benchVQReadTCP(b, true) })
	b.Run("raw", func(b *testing.B) {
		devs, _ := tcpRuntimes(b, 2, core.Config{RCPeers: -1})
		x, y := rawPair(b, devs[0], devs[1])
		rawRead8(b, x, y, true)
	})
	b.Run("raw-dc", func(b *testing.B) {
		devs, _ := tcpRuntimes(b, 2, core.Config{RCPeers: -1})
		x, y := rawDCPair(b, devs[0], devs[1])
		rawRead8(b, x, y, true)
	})
}

// benchVQReadTCP times sync 8 B READs through a VQ waiting in PopWait,
// after the runtime moved it to an RC QP if rc. It reports the time spent
// in Push and in PopWait per op (push-ns, pop-ns), as rawRead8 does for
// PostSend and the CQ, so a gap between the two splits into its halves.
func benchVQReadTCP(b *testing.B, rc bool) {
	cfg := core.Config{RCPeers: -1}
	if rc {
		// One sync READ at a time over TCP makes ~700 requests in the
		// default 10 ms window, under the default 4096 that make a peer hot.
		cfg.RCPeers, cfg.HotOps = 0, 256
	}
	_, rts := tcpRuntimes(b, 2, cfg)
	q, req := vqReader(b, rts[0], rts[1])
	var out [1]krcore.Completion
	ctx := context.Background()
	var tpush, tpop time.Duration
	read := func() {
		t0 := time.Now()
		if _, err := q.Push(ctx, false, req); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := q.PopWait(ctx, out[:]); err != nil {
			b.Fatal(err)
		}
		tpush += t1.Sub(t0)
		tpop += time.Since(t1)
		if out[0].Status != verbs.Success {
			b.Fatal(out[0].Status)
		}
	}
	warmRC(b, rts[0], rc, read)
	tpush, tpop = 0, 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		read()
	}
	b.ReportMetric(float64(tpush.Nanoseconds())/float64(b.N), "push-ns")
	b.ReportMetric(float64(tpop.Nanoseconds())/float64(b.N), "pop-ns")
}

// warmRC runs read until the runtime has moved the VQ to an RC QP, if rc.
func warmRC(b *testing.B, rt *core.Runtime, rc bool, read func()) {
	if !rc {
		return
	}
	for warm := time.Now(); rt.Stats().RCs == 0 || time.Since(warm) < 50*time.Millisecond; {
		if time.Since(warm) > 10*time.Second {
			b.Fatal("the runtime built no RC QP to the hot peer in 10s")
		}
		read()
	}
}

// BenchmarkRead8 compares an 8 B READ through a VQ with one through a raw
// RC QP between the same two soft nodes: vq-dc keeps the VQ on its DCI,
// vq lets the runtime move the hot peer to an RC QP (after a warm-up).
func BenchmarkRead8(b *testing.B) {
	b.Run("vq-dc", func(b *testing.B) { benchVQRead(b, false) })
	b.Run("vq", func(b *testing.B) { benchVQRead(b, true) })
	b.Run("raw", func(b *testing.B) {
		c := benchCluster(b)
		x, y := rawPair(b, c.Devices[0], c.Devices[1])
		b.ReportAllocs()
		rawRead8(b, x, y, false)
	})
	b.Run("raw-dc", func(b *testing.B) {
		c := benchCluster(b)
		x, y := rawDCPair(b, c.Devices[0], c.Devices[1])
		b.ReportAllocs()
		rawRead8(b, x, y, false)
	})
}

// rawRead8 times sync 8 B READs from x of y's MR on a raw RC QP, polling
// the CQ until the completion comes, or sleeping in CQ.Wait between polls
// if wait.
func rawRead8(b *testing.B, x, y rawSide, wait bool) {
	wr := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}}
	if x.dc != nil {
		wr[0].AH, wr[0].RemoteQPN, wr[0].DCKey = x.dc.AH, x.dc.RemoteQPN, x.dc.DCKey
	}
	var wc [1]verbs.WC
	ctx := context.Background()
	var tpush, tpop time.Duration
	reportCPU(b)
	defer func() {
		b.ReportMetric(float64(tpush.Nanoseconds())/float64(b.N), "push-ns")
		b.ReportMetric(float64(tpop.Nanoseconds())/float64(b.N), "pop-ns")
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := x.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		tpush += t1.Sub(t0)
		for {
			n, err := x.cq.Poll(wc[:])
			if err != nil {
				b.Fatal(err)
			}
			if n > 0 {
				break
			}
			if wait {
				if err := x.cq.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		tpop += time.Since(t1)
		if wc[0].Status != verbs.Success {
			b.Fatal(wc[0].Status)
		}
	}
}

type rawSide struct {
	qp verbs.QP
	cq verbs.CQ
	mr verbs.MR
	dc *verbs.SendWR // a DCI's target (AH, DCT number, key); nil on RC
}

// rawPair connects two RC QPs the way a verbs program does.
func rawPair(b *testing.B, da, db verbs.Device) (rawSide, rawSide) {
	mk := func(d verbs.Device) rawSide {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
		if err != nil {
			b.Fatal(err)
		}
		blk, _ := offheap.Alloc(4096)
		mr, _ := pd.RegMR(blk.Bytes(), verbs.AccessAll)
		b.Cleanup(func() { qp.Close(); mr.Close(); cq.Close(); pd.Close(); blk.Close() })
		return rawSide{qp: qp, cq: cq, mr: mr}
	}
	x, y := mk(da), mk(db)
	if err := verbs.Connect(x.qp, y.qp.Endpoint(), verbs.Path{}); err != nil {
		b.Fatal(err)
	}
	if err := verbs.Connect(y.qp, x.qp.Endpoint(), verbs.Path{}); err != nil {
		b.Fatal(err)
	}
	return x, y
}

// rawDCPair makes a DCI on da that reaches a DCT on db, each with its own
// PD, CQ and MR; the DCI's requests go out as rawRead8 posts them, with the
// AH, DCT number and key filled in by the returned side's target.
func rawDCPair(b *testing.B, da, db verbs.Device) (rawSide, rawSide) {
	const key = 0x5eed
	var pdA verbs.PD
	mk := func(d verbs.Device, init verbs.QPInit) rawSide {
		pd, _ := d.AllocPD()
		if d == da {
			pdA = pd
		}
		cq, _ := d.CreateCQ(64)
		init.SendCQ, init.RecvCQ = cq, cq
		if init.Type == verbs.DCT {
			srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { srq.Close() })
			init.SRQ = srq
		}
		qp, err := pd.CreateQP(init)
		if err != nil {
			b.Fatal(err)
		}
		if err := verbs.Ready(qp, verbs.Path{Access: verbs.AccessAll}); err != nil {
			b.Fatal(err)
		}
		blk, _ := offheap.Alloc(4096)
		mr, _ := pd.RegMR(blk.Bytes(), verbs.AccessAll)
		b.Cleanup(func() { qp.Close(); mr.Close(); cq.Close(); pd.Close(); blk.Close() })
		return rawSide{qp: qp, cq: cq, mr: mr}
	}
	x := mk(da, verbs.QPInit{Type: verbs.DCI, Cap: verbs.QPCap{MaxSendWR: 64}})
	y := mk(db, verbs.QPInit{Type: verbs.DCT, DCKey: key})
	ah, err := pdA.CreateAH(verbs.AHAttr{Dest: y.qp.Endpoint()})
	if err != nil {
		b.Fatal(err)
	}
	x.dc = &verbs.SendWR{AH: ah, RemoteQPN: y.qp.Num(), DCKey: key}
	return x, y
}

// vqReader exports 64 B on s and returns a VQ of a connected to it with an
// 8 B READ request of that region.
func vqReader(b testing.TB, a, s *core.Runtime) (*core.Queue, krcore.Request) {
	b.Helper()
	mr, err := s.RegMR(64, verbs.AccessAll)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Export("r", mr, 0, 64, verbs.AccessRemoteRead); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g, err := a.Region(ctx, s.Node(), "r")
	if err != nil {
		b.Fatal(err)
	}
	q, err := a.Queue()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { q.Close() })
	if err := q.Connect(ctx, s.Node(), nil); err != nil {
		b.Fatal(err)
	}
	local, err := a.RegMR(64, verbs.AccessAll)
	if err != nil {
		b.Fatal(err)
	}
	return q, krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}
}

// benchVQRead times sync 8 B READs through a VQ.
func benchVQRead(b *testing.B, rc bool) {
	c := benchCluster(b, rc)
	a := c.Node(1)
	q, req := vqReader(b, a, c.Node(2))
	ctx := context.Background()
	var out [1]krcore.Completion
	read := func() {
		if _, err := q.Push(ctx, false, req); err != nil {
			b.Fatal(err)
		}
		for q.Pop(out[:]) == 0 {
		}
		if out[0].Status != verbs.Success {
			b.Fatal(out[0].Status)
		}
	}
	warmRC(b, a, rc, read)
	b.ReportAllocs()
	reportCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		read()
	}
}
