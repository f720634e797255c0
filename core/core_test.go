package core_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// mode is a way the runtime runs: on DC (with its RC pool), or RC-only on
// devices without DC (as on rxe), or RC-only by Config on DC devices.
type mode struct {
	name   string
	noDC   bool // soft.Config.NoDC: the devices lack DC
	rcOnly bool // core.Config.RCOnly on DC devices
}

var (
	modeDC     = mode{name: "dc"}
	modeNoDC   = mode{name: "rc-only", noDC: true}
	modeForced = mode{name: "rc-only-forced", rcOnly: true}
)

// checkRoute fails t unless rt runs as m says: no DCI in RC-only modes.
func (m mode) checkRoute(t *testing.T, rt *core.Runtime) {
	t.Helper()
	st := rt.Stats()
	if want := m.noDC || m.rcOnly; st.RCOnly != want || want && (st.DCIs != 0 || st.RCs == 0) {
		t.Errorf("mode %s: stats %+v", m.name, st)
	}
}

// inModes runs a test in each mode given as a subtest.
func inModes(t *testing.T, f func(t *testing.T, m mode), ms ...mode) {
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

func start(t *testing.T, nodes int, rc core.Config) *cluster.Cluster {
	return modeDC.start(t, nodes, rc)
}

// start brings up a cluster in the mode. RC-only modes ignore RCPeers < 0
// (DC tests use it to keep every VQ on the DCIs; without DC the RC pool is
// the only route).
func (m mode) start(t *testing.T, nodes int, rc core.Config) *cluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, m.config(nodes, rc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// config is the cluster configuration start uses: the mode's, with short
// timeouts (Add takes it to restart a node).
func (m mode) config(nodes int, rc core.Config) cluster.Config {
	if rc.Path.Timeout == 0 {
		rc.Path = verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}
	}
	if m.noDC || m.rcOnly {
		rc.RCOnly = m.rcOnly
		rc.RCPeers = max(rc.RCPeers, 0)
	}
	return cluster.Config{Nodes: nodes, Runtime: rc, Soft: soft.Config{RetryTimeout: 300 * time.Millisecond, NoDC: m.noDC}}
}

// patientPath is the QPs' path for tests of something other than
// timeouts: a request unanswered for 2 s fails, not config's 200 ms,
// which stalls of the soft RNIC's goroutines reach under -race on two
// loaded cores (up to half a second measured), failing correct requests
// with RETRY_EXC_ERR.
var patientPath = verbs.Path{Timeout: 500 * time.Millisecond, RetryCount: 3}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// serve exports a region of size bytes on rt as name.
func serve(t *testing.T, rt *core.Runtime, name string, size int) krcore.MR {
	t.Helper()
	mr, err := rt.RegMR(size, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Export(name, mr, 0, size, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	return mr
}

// mustQueue is a queue of rt connected to node; opts (at most one) says how.
func mustQueue(t *testing.T, rt *core.Runtime, node krcore.NodeID, opts ...*krcore.ConnectOptions) *core.Queue {
	t.Helper()
	q, err := rt.Queue()
	if err != nil {
		t.Fatal(err)
	}
	var o *krcore.ConnectOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if err := q.Connect(ctx(t), node, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// portPair is a SEND test's two ends on c: node 2's queue bound to port 7
// (srv) and node 1's connected to it (cli), both closed when t ends.
func portPair(t *testing.T, c *cluster.Cluster) (srv, cli *core.Queue) {
	t.Helper()
	srv, err := c.Node(2).Queue()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := srv.Bind(7); err != nil {
		t.Fatal(err)
	}
	return srv, mustQueue(t, c.Node(1), 2, &krcore.ConnectOptions{Port: 7})
}

func pop1(t *testing.T, q *core.Queue) krcore.Completion {
	t.Helper()
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx(t), out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func TestOneSided(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{})
		a, b := c.Node(1), c.Node(2)
		remote := serve(t, b, "data", 4096)
		copy(remote.Bytes()[100:], "from b")
		q := mustQueue(t, a, 2)
		g, err := q.Region(ctx(t), "data")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(4096, verbs.AccessAll)
		reqs := []krcore.Request{
			{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 6), Remote: g.At(100)},
			{ID: 2, Op: verbs.OpWrite, Local: local.Range(0, 6), Remote: g.At(200)},
			{ID: 3, Op: verbs.OpFetchAdd, Local: local.Range(8, 8), Remote: g.At(512), Compare: 5},
			{ID: 4, Op: verbs.OpCompareSwap, Local: local.Range(16, 8), Remote: g.At(512), Compare: 5, Swap: 9},
		}
		if _, err := q.Push(ctx(t), true, reqs...); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			if wc := pop1(t, q); wc.ID != uint64(i+1) || wc.Status != verbs.Success || wc.Len != reqs[i].Local.Len {
				t.Fatalf("completion %d: %+v, want SUCCESS moving %d bytes", i, wc, reqs[i].Local.Len)
			}
		}
		if string(local.Bytes()[:6]) != "from b" || string(remote.Bytes()[200:206]) != "from b" {
			t.Fatal("READ or WRITE did not move the data")
		}
		if binary.LittleEndian.Uint64(remote.Bytes()[512:]) != 9 || binary.LittleEndian.Uint64(local.Bytes()[16:]) != 5 {
			t.Fatal("atomics wrong")
		}
		m.checkRoute(t, a)
		if _, err := a.Region(ctx(t), 2, "nope"); !errors.Is(err, krcore.ErrNoRegion) {
			t.Fatalf("unknown region: %v", err)
		}
	}, modeDC, modeNoDC, modeForced)
}

func TestTwoSided(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{})
		a, b := c.Node(1), c.Node(2)
		srv, cli := portPair(t, c)
		buf, _ := b.RegMR(4096, verbs.AccessLocalWrite)
		srv.PushRecv(buf.Range(0, 64), buf.Range(64, 64))
		if err := cli.Bind(8); err != nil {
			t.Fatal(err)
		}
		msg, _ := a.RegMR(64, verbs.AccessLocalWrite)
		copy(msg.Bytes(), "ping")
		cli.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpSendImm, Imm: 42, Local: msg.Range(0, 4)})
		if wc := pop1(t, cli); wc.Status != verbs.Success || wc.Len != 4 {
			t.Fatalf("send: %+v, want SUCCESS moving 4 bytes", wc)
		}
		var msgs [1]krcore.Message
		if _, err := srv.PopMsgsWait(ctx(t), msgs[:]); err != nil {
			t.Fatal(err)
		}
		got := msgs[0]
		if got.From != 1 || got.Port != 8 || got.Len != 4 || !got.HasImm || got.Imm != 42 || got.Buf == nil || string(buf.Bytes()[:4]) != "ping" {
			t.Fatalf("message %+v %q", got, buf.Bytes()[:4])
		}
		if err := srv.Bind(9); !errors.Is(err, krcore.ErrPortInUse) {
			t.Errorf("second bind: %v", err)
		}
		other, _ := b.Queue()
		defer other.Close()
		if err := other.Bind(7); !errors.Is(err, krcore.ErrPortInUse) {
			t.Errorf("port taken twice: %v", err)
		}
	}, modeDC, modeNoDC, modeForced)
}

// TestSharedQPIsolation: 64 VQs in 8 goroutines share one DCI (RC-only:
// one RC QP); each sees
// exactly its own completions, in order.
func TestSharedQPIsolation(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Credits: 8, Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		remote := serve(t, b, "ctr", 64*8)
		g, err := a.Region(ctx(t), 2, "ctr")
		if err != nil {
			t.Fatal(err)
		}
		const vqs, perVQ = 64, 200
		var wg sync.WaitGroup
		errs := make(chan error, vqs)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for v := w; v < vqs; v += 8 {
					errs <- runVQ(t, a, g, v, perVQ)
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		for v := 0; v < vqs; v++ {
			if n := binary.LittleEndian.Uint64(remote.Bytes()[v*8:]); n != perVQ {
				t.Errorf("VQ %d counter %d, want %d", v, n, perVQ)
			}
		}
		m.checkRoute(t, a)
		if st := a.Stats(); st.RCOnly && (st.RCs != 1 || st.RCBuilt != 1) {
			t.Errorf("RC-only: %d RC QPs (%d built) carried the VQs, want 1", st.RCs, st.RCBuilt)
		}
	}, modeDC, modeNoDC)
}

// TestPopOwnOnly: two queues share one DCI (RC-only: one RC QP); each
// pushes a READ alone, then pops it with Pop, whose poll takes its own
// queue's completions for itself (completeOwn) and must leave the other
// queue's to it, though that one sits before its own on the QP. A READ of
// a revoked region popped so completes with REM_ACCESS_ERR, not as a
// success, and the READ behind it on the other queue still succeeds.
func TestPopOwnOnly(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "data", 64)
		doomed := serve(t, b, "doomed", 64)
		g, err := a.Region(ctx(t), 2, "data")
		if err != nil {
			t.Fatal(err)
		}
		gone, err := a.Region(ctx(t), 2, "doomed")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(64, verbs.AccessAll)
		qs := [2]*core.Queue{mustQueue(t, a, 2), mustQueue(t, a, 2)}
		c0 := ctx(t)
		read := func(q *core.Queue, id uint64, g krcore.Region) {
			t.Helper()
			if err := q.PushOne(c0, true, krcore.Request{ID: id, Op: verbs.OpRead, Local: local.Range(int(id%8)*8, 8), Remote: g.At(0)}); err != nil {
				t.Fatal(err)
			}
		}
		var out [4]krcore.Completion
		popOwn := func(q *core.Queue, id uint64, st verbs.Status) {
			t.Helper()
			for {
				if k := q.Pop(out[:]); k > 0 {
					if k != 1 || out[0].ID != id || out[0].Status != st {
						t.Fatalf("Pop: %+v, want only request %d with %s", out[:k], id, st)
					}
					return
				}
				if c0.Err() != nil {
					t.Fatalf("request %d never completed: %v", id, c0.Err())
				}
				runtime.Gosched()
			}
		}
		for i := range uint64(200) {
			first, second := qs[i%2], qs[1-i%2]
			read(first, 2*i, g)
			read(second, 2*i+1, g)
			popOwn(second, 2*i+1, verbs.Success) // its poll meets first's completion first
			popOwn(first, 2*i, verbs.Success)
		}
		if err := b.Deregister(doomed); err != nil {
			t.Fatal(err)
		}
		read(qs[0], 1000, gone)
		read(qs[1], 1001, g)
		popOwn(qs[0], 1000, verbs.RemAccessErr)
		popOwn(qs[1], 1001, verbs.Success)
	}, modeDC, modeNoDC)
}

// runVQ pushes n FAAs (every third unsignaled) on its own counter and checks
// it gets back exactly the signaled ones, in order.
func runVQ(t *testing.T, rt *core.Runtime, g krcore.Region, v, n int) error {
	q, err := rt.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Connect(ctx(t), g.Node(), nil); err != nil {
		return err
	}
	local, _ := rt.RegMR(8*n, verbs.AccessAll)
	defer rt.Deregister(local)
	var want []uint64
	out := make([]krcore.Completion, 16)
	check := func(k int) error {
		for _, wc := range out[:k] {
			if len(want) == 0 || wc.ID != want[0] || wc.Status != verbs.Success {
				return fmt.Errorf("VQ %d: got completion %#x %s, want %#x", v, wc.ID, wc.Status, want)
			}
			want = want[1:]
		}
		return nil
	}
	for i := 0; i < n; i++ {
		id := uint64(v)<<32 | uint64(i)
		r := krcore.Request{ID: id, Op: verbs.OpFetchAdd, Local: local.Range(8*i, 8), Remote: g.At(uint64(8 * v)), Compare: 1, Unsignaled: i%3 == 1 && i != n-1}
		if !r.Unsignaled {
			want = append(want, id)
		}
		for {
			_, err := q.Push(ctx(t), false, r)
			if err == nil {
				break
			}
			if !errors.Is(err, krcore.ErrNoCredit) {
				return fmt.Errorf("VQ %d push %d: %w", v, i, err)
			}
			k, err := q.PopWait(ctx(t), out) // a full queue: make room
			if err != nil {
				return fmt.Errorf("VQ %d: %w %s; %s", v, err, core.DebugState(q), core.DebugPQP(rt))
			}
			if err := check(k); err != nil {
				return err
			}
		}
	}
	for len(want) > 0 {
		k, err := q.PopWait(ctx(t), out)
		if err != nil {
			return fmt.Errorf("VQ %d: %w (%d completions missing) %s; %s", v, err, len(want), core.DebugState(q), core.DebugPQP(rt))
		}
		if err := check(k); err != nil {
			return err
		}
	}
	return nil
}

// TestMalformedNeighbours: VQs pushing random malformed requests share the
// QP with VQs doing correct work; the correct ones never fail.
func TestMalformedNeighbours(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "ctr", 4096)
		g, _ := a.Region(ctx(t), 2, "ctr")
		var wg sync.WaitGroup
		stop := make(chan struct{})
		fuzzing := make(chan struct{})
		var once sync.Once
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				fuzzVQ(t, a, g, seed, stop, func() { once.Do(func() { close(fuzzing) }) })
			}(uint64(i))
		}
		// The correct VQs start once a malformed request has been
		// refused: started together, they sometimes finished before any
		// fuzzer ran (the test then failed for not having fuzzed).
		select {
		case <-fuzzing:
		case <-ctx(t).Done():
			close(stop)
			wg.Wait()
			t.Fatal("no fuzzer got a request refused")
		}
		errs := make(chan error, 8)
		var good sync.WaitGroup
		for v := 0; v < 8; v++ {
			good.Add(1)
			go func(v int) {
				defer good.Done()
				errs <- runVQ(t, a, g, v, 300)
			}(v)
		}
		good.Wait()
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if a.Stats().Refusals == 0 {
			t.Error("no request was refused: the fuzzer did not fuzz")
		}
	}, modeDC, modeNoDC)
}

// fuzzVQ pushes random, mostly malformed requests until stop, calling
// refused once the runtime has refused one of them.
func fuzzVQ(t *testing.T, rt *core.Runtime, g krcore.Region, seed uint64, stop chan struct{}, refused func()) {
	r := rand.New(rand.NewPCG(seed, 7))
	q, _ := rt.Queue()
	defer q.Close()
	c := ctx(t) // one context for the loop: each ctx(t) adds a cleanup
	q.Connect(c, g.Node(), nil)
	mine, _ := rt.RegMR(256, verbs.AccessAll)
	ro, _ := rt.RegMR(256, 0)
	ops := []verbs.Opcode{0, 99, verbs.OpRead, verbs.OpWrite, verbs.OpFetchAdd, verbs.OpCompareSwap, verbs.OpSend, verbs.OpWriteImm}
	out := make([]krcore.Completion, 32)
	for {
		select {
		case <-stop:
			return
		default:
		}
		mr := []krcore.MR{mine, ro, nil}[r.IntN(3)]
		req := krcore.Request{Op: ops[r.IntN(len(ops))], Local: krcore.Local{MR: mr, Off: r.IntN(300) - 20, Len: r.IntN(300)},
			Remote: g.At(uint64(r.IntN(5000))), Compare: 1}
		if r.IntN(4) == 0 {
			req.Remote.Region = nil
		}
		_, err := q.Push(c, false, req)
		if err != nil && !errors.Is(err, krcore.ErrNoCredit) {
			t.Errorf("fuzzer push: %v", err)
			return
		}
		if refused != nil && rt.Stats().Refusals > 0 {
			refused()
			refused = nil
		}
		if err == nil {
			q.Pop(out)
			continue
		}
		// A full queue: wait for room, as a client does. Fuzzers
		// spinning on Push and Pop would take both cores from the soft
		// RNIC's goroutines (its responder, its retry timer) under
		// -race, and the correct VQs' requests would time out
		// (RETRY_EXC_ERR) for want of a responder.
		if _, err := q.PopWait(c, out); err != nil {
			t.Errorf("fuzzer wait: %v", err)
			return
		}
	}
}

// TestRevokedRegion: a region deregistered mid-traffic fails only the VQs
// that touch it; the shared QP recovers and the rest carry on.
func TestRevokedRegion(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "keep", 4096)
		doomed := serve(t, b, "doomed", 4096)
		keep, _ := a.Region(ctx(t), 2, "keep")
		gone, _ := a.Region(ctx(t), 2, "doomed")
		victim := mustQueue(t, a, 2)
		local, _ := a.RegMR(64, verbs.AccessAll)
		read := func(q *core.Queue, g krcore.Region) krcore.Completion {
			q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)})
			return pop1(t, q)
		}
		if wc := read(victim, gone); wc.Status != verbs.Success {
			t.Fatalf("before revoke: %+v", wc)
		}
		errs := make(chan error, 4)
		stop := make(chan struct{})
		states := samplePool(t, a, stop)
		var wg sync.WaitGroup
		for v := 0; v < 4; v++ {
			wg.Add(1)
			go func(v int) {
				defer wg.Done()
				q, _ := a.Queue()
				defer q.Close()
				q.Connect(ctx(t), 2, nil)
				mine, _ := a.RegMR(8, verbs.AccessAll)
				for i := 0; ; i++ {
					select {
					case <-stop:
						errs <- nil
						return
					default:
					}
					q.Push(ctx(t), true, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: mine.Range(0, 8), Remote: keep.At(8)})
					if wc := pop1(t, q); wc.Status != verbs.Success {
						errs <- fmt.Errorf("innocent VQ %d: %+v", v, wc)
						return
					}
				}
			}(v)
		}
		b.Deregister(doomed)
		if wc := read(victim, gone); wc.Status != verbs.RemAccessErr {
			t.Errorf("after revoke: %+v, want REM_ACCESS_ERR", wc)
		}
		if wc := read(victim, keep); wc.Status != verbs.Success {
			t.Errorf("victim's next request: %+v", wc)
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if a.Stats().Recoveries == 0 {
			t.Error("no recovery counted")
		}
		t.Logf("pool QP states sampled: %v", <-states)
		m.checkRoute(t, a)
		if st := a.Stats(); st.RCOnly && st.RCBuilt < 2 {
			t.Errorf("RC-only: the broken RC QP was not replaced: %+v", st)
		}
	}, modeDC, modeNoDC)
}

// TestPeerKilled: VQs to a dead node fail within the timeout; nothing hangs
// and VQs to other nodes are unaffected.
func TestPeerKilled(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 3, core.Config{DCIs: 1, RCPeers: -1})
		a := c.Node(1)
		serve(t, c.Node(2), "r", 64)
		serve(t, c.Node(3), "r", 64)
		g2, _ := a.Region(ctx(t), 2, "r")
		g3, _ := a.Region(ctx(t), 3, "r")
		q2, q3 := mustQueue(t, a, 2), mustQueue(t, a, 3)
		local, _ := a.RegMR(64, verbs.AccessAll)
		c.Node(3).Close()
		c.Devices[2].Close()
		start := time.Now()
		q3.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g3.At(0)})
		q2.Push(ctx(t), true, krcore.Request{ID: 2, Op: verbs.OpRead, Local: local.Range(8, 8), Remote: g2.At(0)})
		if wc := pop1(t, q3); wc.Status != verbs.RetryExcErr {
			t.Errorf("dead peer: %+v", wc)
		}
		if wc := pop1(t, q2); wc.Status != verbs.Success {
			t.Errorf("live peer: %+v", wc)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("took %v", d)
		}
	}, modeDC, modeNoDC)
}

// TestChurnDCtoRC: traffic hot enough to build RC QPs while the budget
// forces evictions back to DC; under -race, no request is lost or
// reordered.
//
// patientPath: the test is of routing, not of timeouts. Twelve VQs keep
// 128 atomics each in flight to the same three nodes of one process; with
// the default 200 ms without progress, a stall of that process's soft RNIC
// goroutines under -race at load 20 timed a request out (RETRY_EXC_ERR,
// 1 run in 5), and a DC timeout marks its peer dead at once, failing
// every VQ's requests to it. Every completion must still be SUCCESS.
func TestChurnDCtoRC(t *testing.T) {
	c := start(t, 4, core.Config{DCIs: 2, RCPeers: 1, HotOps: 50, HotWindow: 2 * time.Millisecond, ColdWindows: 3, Path: patientPath})
	a := c.Node(1)
	var gs []krcore.Region
	for n := krcore.NodeID(2); n <= 4; n++ {
		serve(t, c.Node(n), "ctr", 64*8)
		g, err := a.Region(ctx(t), n, "ctr")
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	stop := make(chan struct{})
	states := samplePool(t, a, stop)
	// Hot is a rate (HotOps in a HotWindow): on a loaded machine a pass
	// may stay under it to every peer, so passes repeat, each checked,
	// until one built an RC QP.
	for pass := 0; pass < 10 && (pass == 0 || a.Stats().RCBuilt == 0); pass++ {
		var wg sync.WaitGroup
		errs := make(chan error, 12)
		for v := 0; v < 12; v++ {
			wg.Add(1)
			go func(v int) {
				defer wg.Done()
				for round := 0; round < 3; round++ {
					if err := runVQ(t, a, gs[(v+round)%3], v, 400); err != nil {
						errs <- err
						return
					}
				}
			}(v)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	close(stop)
	s := a.Stats()
	t.Logf("stats: %+v; pool QP states sampled: %v", s, <-states)
	if s.RCBuilt == 0 {
		t.Error("no RC QP was built")
	}
}
