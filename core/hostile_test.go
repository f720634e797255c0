package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// withDeadline runs f with a context that ends after d and fails t unless f
// returns within d plus a second: a hang fails the test instead of
// blocking it.
func withDeadline(t *testing.T, d time.Duration, what string, f func(ctx context.Context) error) error {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return bounded.Within(t, d+time.Second, what, func() error { return f(c) })
}

// TestHostileRecvBuffers posts receive buffers that lie outside their MR
// in every way a caller can forge: each is refused, and a message sent
// afterwards still lands in a good buffer (the receive path survives).
func TestHostileRecvBuffers(t *testing.T) {
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	srv, err := b.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Bind(9); err != nil {
		t.Fatal(err)
	}
	mr, _ := b.RegMR(4096, verbs.AccessAll)
	ro, _ := b.RegMR(4096, verbs.AccessRemoteRead)
	foreign, _ := a.RegMR(4096, verbs.AccessAll)
	bad := map[string]krcore.Local{
		"nil MR":           {Len: 8},
		"zero MR":          {MR: &core.MR{}, Len: 8},
		"foreign MR":       foreign.Range(0, 8),
		"negative off":     mr.Range(-1, 8),
		"negative len":     mr.Range(0, -8),
		"zero len":         mr.Range(0, 0),
		"past the end":     mr.Range(4090, 8),
		"off MaxInt":       mr.Range(math.MaxInt, 1),
		"len MaxInt":       mr.Range(1, math.MaxInt),
		"off+len overflow": mr.Range(math.MaxInt-2, 8),
		"no LOCAL_WRITE":   ro.Range(0, 8),
	}
	for name, l := range bad {
		if err := srv.PushRecv(l); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("PushRecv(%s): %v, want ErrInvalid", name, err)
		}
		// Behind good buffers it refuses them all: none stays held
		// (and none is posted: the message below lands in mr at 0).
		if err := srv.PushRecv(mr.Range(0, 16), mr.Range(16, 16), l); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("PushRecv(good, good, %s): %v, want ErrInvalid", name, err)
		}
		if n := core.MRUses(mr); n != 0 {
			t.Fatalf("PushRecv(good, good, %s) refused, but %d holds on the good MR remain", name, n)
		}
	}
	if err := srv.PushRecv(mr.Range(0, 16)); err != nil {
		t.Fatal(err)
	}
	cli := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 9})
	copy(foreign.Bytes(), "hello")
	if _, err := cli.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: foreign.Range(0, 5)}); err != nil {
		t.Fatal(err)
	}
	if wc := pop1(t, cli); wc.Status != verbs.Success {
		t.Fatalf("send: %+v", wc)
	}
	var msgs [1]krcore.Message
	if _, err := srv.PopMsgsWait(ctx(t), msgs[:]); err != nil {
		t.Fatal(err)
	}
	if m := msgs[0]; m.Buf == nil || m.Buf.Off != 0 || m.Len != 5 || string(mr.Bytes()[:5]) != "hello" {
		t.Fatalf("message %+v", m)
	}
}

// TestHostileUseAfterClose calls every method of a closed runtime, of a
// queue of it and of an MR of it: each fails with ErrClosed (or, for calls
// without an error, returns), within a bound, without a panic.
func TestHostileUseAfterClose(t *testing.T) {
	c := start(t, 2, core.Config{})
	if err := c.Remove(2, false); err != nil {
		t.Fatal(err)
	}
	ctx0 := ctx(t)
	// Node 3 is closed by hand: its MR, queue and export were made live.
	if err := c.Add(ctx0, modeDC.config(3, core.Config{}), 3); err != nil {
		t.Fatal(err)
	}
	rt, dev := c.Node(3), c.Devices[len(c.Devices)-1]
	mr := serve(t, rt, "x", 4096)
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	if _, err = rt.Register(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	q, err := rt.Queue()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(ctx0, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	// Close released everything made from the runtime, the caller's
	// registrations and exports too.
	if st := dev.Stats(); st.MRs != 0 || st.PDs != 0 {
		t.Errorf("after Close the device still holds %+v", st)
	}
	buf := blk.Bytes()[:64]
	cases := []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"Close", func(context.Context) error { return rt.Close() }},
		{"Queue", func(context.Context) error { _, err := rt.Queue(); return err }},
		{"RegMR", func(context.Context) error { _, err := rt.RegMR(64, verbs.AccessAll); return err }},
		{"Register", func(context.Context) error { _, err := rt.Register(buf, verbs.AccessAll); return err }},
		{"Deregister", func(context.Context) error { return rt.Deregister(mr) }},
		{"Export", func(context.Context) error { return rt.Export("y", mr, 0, 64, verbs.AccessRemoteRead) }},
		{"Region", func(ctx context.Context) error { _, err := rt.Region(ctx, 1, "x"); return err }},
		{"Queue.Connect", func(ctx context.Context) error { return q.Connect(ctx, 1, nil) }},
		{"Queue.Push", func(ctx context.Context) error {
			_, err := q.Push(ctx, true, krcore.Request{Op: verbs.OpWrite})
			return err
		}},
		{"Queue.PopWait", func(ctx context.Context) error {
			var out [1]krcore.Completion
			_, err := q.PopWait(ctx, out[:])
			return err
		}},
		{"Queue.PopMsgsWait", func(ctx context.Context) error {
			var out [1]krcore.Message
			_, err := q.PopMsgsWait(ctx, out[:])
			return err
		}},
		{"Queue.PushRecv", func(context.Context) error { return q.PushRecv(mr.Range(0, 64)) }},
		{"Queue.Bind", func(context.Context) error { return q.Bind(77) }},
		{"Queue.Region", func(ctx context.Context) error { _, err := q.Region(ctx, "x"); return err }},
		{"Queue.Close", func(context.Context) error { return q.Close() }},
		{"Group.Wait", func(ctx context.Context) error {
			return rt.Group().Wait(ctx, func() bool { return false }, nil)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := withDeadline(t, 2*time.Second, tc.name, tc.f)
			if !errors.Is(err, krcore.ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", tc.name, err)
			}
		})
	}
	// Calls without an error must merely return.
	var out [4]krcore.Completion
	q.Pop(out[:])
	q.PopMsgs(make([]krcore.Message, 4))
	q.Outstanding()
	q.Unbind()
	rt.Unexport("x")
	rt.Stats()
}

// TestHostileEmptyOut hands the waiting Pops an empty slice: they cannot
// ever return a completion, so they must refuse at once, not wait until
// their context ends.
func TestHostileEmptyOut(t *testing.T) {
	c := start(t, 2, core.Config{})
	q := mustQueue(t, c.Node(1), 2)
	if err := q.Bind(5); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(ctx context.Context) error{
		"PopWait":     func(ctx context.Context) error { _, err := q.PopWait(ctx, nil); return err },
		"PopMsgsWait": func(ctx context.Context) error { _, err := q.PopMsgsWait(ctx, []krcore.Message{}); return err },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := withDeadline(t, 3*time.Second, name, f)
			if !errors.Is(err, verbs.ErrInvalid) || time.Since(start) > time.Second {
				t.Errorf("%s with no room: %v after %v, want ErrInvalid at once", name, err, time.Since(start))
			}
		})
	}
	if n := q.Pop(nil); n != 0 {
		t.Errorf("Pop(nil) = %d", n)
	}
	if n := q.PopMsgs(nil); n != 0 {
		t.Errorf("PopMsgs(nil) = %d", n)
	}
}

// TestHostileBindClosed binds a port on a closed queue: refused with
// ErrClosed, and the port stays free for a live queue.
func TestHostileBindClosed(t *testing.T) {
	c := start(t, 1, core.Config{})
	rt := c.Node(1)
	q, _ := rt.Queue()
	q.Close()
	if err := q.Bind(12); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Bind on a closed queue: %v, want ErrClosed", err)
	}
	live, _ := rt.Queue()
	defer live.Close()
	if err := live.Bind(12); err != nil {
		t.Errorf("the port a closed queue tried to bind: %v", err)
	}
}

// argSentinels are the errors a bad argument may match: what is wrong
// with it (ErrInvalid, ErrLimit), or that it names what is not the
// runtime's (ErrRefused), needs a connection (ErrNotConnected) or does
// not exist (ErrNoRegion, ErrUnreachable).
var argSentinels = []error{verbs.ErrInvalid, verbs.ErrLimit, krcore.ErrRefused, krcore.ErrNotConnected, krcore.ErrNoRegion, krcore.ErrUnreachable}

// TestHostileArgs hands the runtime's registration and export calls every
// bad argument: each is an error matching a sentinel, never a panic.
func TestHostileArgs(t *testing.T) {
	c := start(t, 2, core.Config{})
	rt, other := c.Node(1), c.Node(2)
	mr, _ := rt.RegMR(4096, verbs.AccessAll)
	ro, _ := rt.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	foreign, _ := other.RegMR(4096, verbs.AccessAll)
	long := strings.Repeat("n", 100000)
	cases := map[string]func() error{
		"RegMR -1":           func() error { _, err := rt.RegMR(-1, verbs.AccessAll); return err },
		"RegMR 0":            func() error { _, err := rt.RegMR(0, verbs.AccessAll); return err },
		"RegMR MinInt":       func() error { _, err := rt.RegMR(math.MinInt, verbs.AccessAll); return err },
		"RegMR MaxInt":       func() error { _, err := rt.RegMR(math.MaxInt, verbs.AccessAll); return err },
		"RegMR bad access":   func() error { _, err := rt.RegMR(64, verbs.Access(1<<30)); return err },
		"Register nil":       func() error { _, err := rt.Register(nil, verbs.AccessAll); return err },
		"Register empty":     func() error { _, err := rt.Register([]byte{}, verbs.AccessAll); return err },
		"Deregister nil":     func() error { return rt.Deregister(nil) },
		"Deregister zero":    func() error { return rt.Deregister(&core.MR{}) },
		"Deregister foreign": func() error { return rt.Deregister(foreign) },
		"Export nil MR":      func() error { return rt.Export("a", nil, 0, 1, verbs.AccessRemoteRead) },
		"Export zero MR":     func() error { return rt.Export("a", &core.MR{}, 0, 1, verbs.AccessRemoteRead) },
		"Export foreign":     func() error { return rt.Export("a", foreign, 0, 1, verbs.AccessRemoteRead) },
		"Export empty name":  func() error { return rt.Export("", mr, 0, 1, verbs.AccessRemoteRead) },
		"Export long name":   func() error { return rt.Export(long, mr, 0, 1, verbs.AccessRemoteRead) },
		"Export off -1":      func() error { return rt.Export("a", mr, -1, 1, verbs.AccessRemoteRead) },
		"Export n -1":        func() error { return rt.Export("a", mr, 0, -1, verbs.AccessRemoteRead) },
		"Export n 0":         func() error { return rt.Export("a", mr, 0, 0, verbs.AccessRemoteRead) },
		"Export past end":    func() error { return rt.Export("a", mr, 4000, 97, verbs.AccessRemoteRead) },
		"Export off MaxInt":  func() error { return rt.Export("a", mr, math.MaxInt, 1, verbs.AccessRemoteRead) },
		"Export n MaxInt":    func() error { return rt.Export("a", mr, 1, math.MaxInt, verbs.AccessRemoteRead) },
		"Export write of ro": func() error { return rt.Export("a", ro, 0, 8, verbs.AccessRemoteWrite) },
		"Export local acc":   func() error { return rt.Export("a", mr, 0, 8, verbs.AccessLocalWrite) },
		"Bind 0":             func() error { q, _ := rt.Queue(); defer q.Close(); return q.Bind(0) },
		"Connect node 0": func() error {
			q, _ := rt.Queue()
			defer q.Close()
			return withDeadline(t, 3*time.Second, "Connect 0", func(ctx context.Context) error { return q.Connect(ctx, 0, nil) })
		},
		"Connect reserved port": func() error {
			q, _ := rt.Queue()
			defer q.Close()
			return withDeadline(t, 3*time.Second, "Connect port 1<<31", func(ctx context.Context) error {
				return q.Connect(ctx, 2, &krcore.ConnectOptions{Port: 1 << 31})
			})
		},
		"Connect unknown": func() error {
			q, _ := rt.Queue()
			defer q.Close()
			return withDeadline(t, 3*time.Second, "Connect 99", func(ctx context.Context) error { return q.Connect(ctx, 99, nil) })
		},
		"Region long name": func() error {
			return withDeadline(t, 3*time.Second, "Region", func(ctx context.Context) error { _, err := rt.Region(ctx, 2, long); return err })
		},
		"Region empty name": func() error {
			return withDeadline(t, 3*time.Second, "Region", func(ctx context.Context) error { _, err := rt.Region(ctx, 2, ""); return err })
		},
		"Region node 0": func() error {
			return withDeadline(t, 3*time.Second, "Region", func(ctx context.Context) error { _, err := rt.Region(ctx, 0, "a"); return err })
		},
		"Queue.Region unconnected": func() error {
			q, _ := rt.Queue()
			defer q.Close()
			_, err := q.Region(ctx(t), "a")
			return err
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			err := f()
			for _, want := range argSentinels {
				if errors.Is(err, want) {
					return
				}
			}
			t.Errorf("%s: %v, want an error matching one of %v", name, err, argSentinels)
		})
	}
	if core.Exported(rt, "a") {
		t.Error("a bad Export left a name exported")
	}
}

// TestHostileRequests pushes requests with every field a caller can forge
// wrong, each between two good READs on the same shared QPs, in every
// mode: each forged request completes in order with the error status a
// private QP would give (never SUCCESS), the good READs around it get
// their bytes, and no shared QP needed a recovery. The three go in one
// Push: on a queue whose QP has room, accepted one by one straight into
// the QP's ring under its lock (pushRun), the forged one refused in its
// place between them.
func TestHostileRequests(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c, q, local, g, bad := forgedRequests(t, m)
		a := c.Node(1)
		var out [3]krcore.Completion
		for name, r := range bad {
			clear(local.Bytes()[16:32])
			r.ID = 2
			reqs := betweenReads(local, g, r)
			err := withDeadline(t, 5*time.Second, name, func(ctx context.Context) error {
				if _, err := q.Push(ctx, true, reqs...); err != nil {
					return err
				}
				for got := 0; got < 3; {
					n, err := q.PopWait(ctx, out[got:])
					if err != nil {
						return err
					}
					got += n
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkBetweenReads(t, name, out, local)
		}
		if st := a.Stats(); st.Recoveries != 0 || st.PostErrors != 0 {
			t.Errorf("forged requests reached a shared QP: %+v", st)
		}
	}, modeDC, modeNoDC)
}

// TestHostileRequestsAlone is TestHostileRequests with every request
// pushed alone (PushOne, and Push of one), as a caller that waits for each
// does: on a queue whose route is set and whose QP has room, that is the
// path that accepts a request straight into the QP's ring (pushDirect),
// under the QP's lock, and Pop's poll takes the good READs' completions
// for itself (completeOwn). The forged request comes while the READ
// before it may still be in flight: it completes in its place, with an
// error status, and never reaches a shared QP.
func TestHostileRequestsAlone(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c, q, local, g, bad := forgedRequests(t, m)
		pushes := map[string]func(ctx context.Context, r krcore.Request) error{
			"PushOne": func(ctx context.Context, r krcore.Request) error { return q.PushOne(ctx, true, r) },
			"Push": func(ctx context.Context, r krcore.Request) error {
				_, err := q.Push(ctx, true, r)
				return err
			},
		}
		var out [3]krcore.Completion
		for how, push := range pushes {
			for name, r := range bad {
				clear(local.Bytes()[16:32])
				r.ID = 2
				reqs := betweenReads(local, g, r)
				err := withDeadline(t, 5*time.Second, name, func(ctx context.Context) error {
					for _, r := range reqs {
						if err := push(ctx, r); err != nil {
							return err
						}
					}
					for got := 0; got < 3; { // Pop, whose poll takes its own completions
						got += q.Pop(out[got:])
						if err := ctx.Err(); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatalf("%s %s: %v", how, name, err)
				}
				checkBetweenReads(t, how+" "+name, out, local)
			}
		}
		if st := c.Node(1).Stats(); st.Recoveries != 0 || st.PostErrors != 0 {
			t.Errorf("forged requests reached a shared QP: %+v", st)
		}
	}, modeDC, modeNoDC)
}

// betweenReads is r, to have ID 2, between two good 8-byte READs of g
// (IDs 1 and 3) into local's bytes 16 to 32.
func betweenReads(local *core.MR, g krcore.Region, r krcore.Request) []krcore.Request {
	return []krcore.Request{
		{ID: 1, Op: verbs.OpRead, Local: local.Range(16, 8), Remote: g.At(0)},
		r,
		{ID: 3, Op: verbs.OpRead, Local: local.Range(24, 8), Remote: g.At(8)},
	}
}

// checkBetweenReads checks the completions out of betweenReads's requests
// (named name): the good READs succeeded with their bytes in local, the
// request between them completed with an error status.
func checkBetweenReads(t *testing.T, name string, out [3]krcore.Completion, local *core.MR) {
	t.Helper()
	if out[0].ID != 1 || out[0].Status != verbs.Success || out[2].ID != 3 || out[2].Status != verbs.Success ||
		string(local.Bytes()[16:32]) != "0123456789abcdef" {
		t.Errorf("%s: the good READs around it: %+v %+v, %q", name, out[0], out[2], local.Bytes()[16:32])
	}
	if out[1].ID != 2 || out[1].Status == verbs.Success {
		t.Errorf("%s: completed %+v, want an error status", name, out[1])
	}
}

// forgedRequests starts a cluster of 3 nodes in mode m for the forged
// requests of TestHostileRequests: a queue of node 1 connected to node 2,
// a local MR and node 2's region "data" (its first 16 bytes known) for
// the good READs around them, and every forged request by name.
func forgedRequests(t *testing.T, m mode) (c *cluster.Cluster, q *core.Queue, local *core.MR, g krcore.Region, bad map[string]krcore.Request) {
	c = m.start(t, 3, core.Config{})
	a, b := c.Node(1), c.Node(2)
	remote := serve(t, b, "data", 4096)
	copy(remote.Bytes(), "0123456789abcdef")
	roMR, _ := b.RegMR(4096, verbs.AccessAll)
	if err := b.Export("ro", roMR, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	serve(t, c.Node(3), "data", 4096)
	q = mustQueue(t, a, 2)
	var err error
	g, err = q.Region(ctx(t), "data")
	if err != nil {
		t.Fatal(err)
	}
	ro, err := q.Region(ctx(t), "ro")
	if err != nil {
		t.Fatal(err)
	}
	of3, err := a.Region(ctx(t), 3, "data")
	if err != nil {
		t.Fatal(err)
	}
	ofB, err := b.Region(ctx(t), 2, "data") // learned by another runtime
	if err != nil {
		t.Fatal(err)
	}
	local, _ = a.RegMR(4096, verbs.AccessAll)
	noWrite, _ := a.RegMR(4096, verbs.AccessRemoteRead)
	foreign, _ := b.RegMR(4096, verbs.AccessAll)
	gone, _ := a.RegMR(4096, verbs.AccessAll)
	a.Deregister(gone)
	rd := func(l krcore.Local, r krcore.Remote) krcore.Request {
		return krcore.Request{Op: verbs.OpRead, Local: l, Remote: r}
	}
	bad = map[string]krcore.Request{
		"opcode 0":              {Op: 0, Local: local.Range(0, 8), Remote: g.At(0)},
		"opcode 200":            {Op: 200, Local: local.Range(0, 8), Remote: g.At(0)},
		"SEND without a port":   {Op: verbs.OpSend, Local: local.Range(0, 8)},
		"READ zero length":      rd(local.Range(0, 0), g.At(0)),
		"READ nil MR":           rd(krcore.Local{Len: 8}, g.At(0)),
		"READ zero MR":          rd(krcore.Local{MR: &core.MR{}, Len: 8}, g.At(0)),
		"READ foreign MR":       rd(foreign.Range(0, 8), g.At(0)),
		"READ deregistered MR":  rd(gone.Range(0, 8), g.At(0)),
		"READ negative off":     rd(local.Range(-8, 8), g.At(0)),
		"READ negative len":     rd(local.Range(0, -8), g.At(0)),
		"READ off MaxInt":       rd(local.Range(math.MaxInt, 8), g.At(0)),
		"READ len MaxInt":       rd(local.Range(8, math.MaxInt), g.At(0)),
		"READ past MR end":      rd(local.Range(4090, 8), g.At(0)),
		"READ no LOCAL_WRITE":   rd(noWrite.Range(0, 8), g.At(0)),
		"READ nil region":       rd(local.Range(0, 8), krcore.Remote{Off: 0}),
		"READ zero region":      rd(local.Range(0, 8), krcore.Remote{Region: &core.Region{}}),
		"READ other node":       rd(local.Range(0, 8), of3.At(0)),
		"READ other runtime's":  rd(local.Range(0, 8), ofB.At(0)),
		"READ remote past end":  rd(local.Range(0, 8), g.At(4090)),
		"READ remote MaxUint64": rd(local.Range(0, 8), g.At(math.MaxUint64)),
		"READ remote wraps":     rd(local.Range(0, 16), g.At(math.MaxUint64-7)),
		"READ past region end":  rd(local.Range(0, 8), ro.At(60)), // still inside the MR exported
		"WRITE remote wraps":    {Op: verbs.OpWrite, Local: local.Range(0, 16), Remote: g.At(math.MaxUint64 - 7)},
		"WRITE read-only":       {Op: verbs.OpWrite, Local: local.Range(0, 8), Remote: ro.At(0)},
		"WRITE_IMM read-only":   {Op: verbs.OpWriteImm, Local: local.Range(0, 8), Remote: ro.At(0)},
		"WRITE nil region":      {Op: verbs.OpWrite, Local: local.Range(0, 8)},
		"WRITE zero-len nil":    {Op: verbs.OpWrite, Remote: krcore.Remote{Region: &core.Region{}}},
		"FAA misaligned":        {Op: verbs.OpFetchAdd, Local: local.Range(0, 8), Remote: g.At(3)},
		"CAS misaligned":        {Op: verbs.OpCompareSwap, Local: local.Range(0, 8), Remote: g.At(4092)},
		"FAA 4 bytes":           {Op: verbs.OpFetchAdd, Local: local.Range(0, 4), Remote: g.At(0)},
		"FAA 16 bytes":          {Op: verbs.OpFetchAdd, Local: local.Range(0, 16), Remote: g.At(0)},
		"FAA zero length":       {Op: verbs.OpFetchAdd, Local: local.Range(0, 0), Remote: g.At(0)},
		"CAS read-only":         {Op: verbs.OpCompareSwap, Local: local.Range(0, 8), Remote: ro.At(0)},
		"CAS past end":          {Op: verbs.OpCompareSwap, Local: local.Range(0, 8), Remote: g.At(4096)},
		"FAA unsignaled":        {Op: verbs.OpFetchAdd, Local: local.Range(0, 8), Remote: g.At(5), Unsignaled: true},
		"READ unsignaled":       {Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(4095), Unsignaled: true},
	}
	return c, q, local, g, bad
}

// TestHostileDuplicateNode starts a second runtime under a node id a live
// runtime on another device holds on the same MetaServer: it is refused
// (the id is in use), and the first keeps its id: peers still reach it,
// and its region stays its own.
func TestHostileDuplicateNode(t *testing.T) {
	c := start(t, 2, core.Config{})
	serve(t, c.Node(2), "mine", 64)
	dev, err := c.Fabric.NewNode(soft.Config{RetryTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var dup *core.Runtime
	err = withDeadline(t, 5*time.Second, "New", func(ctx context.Context) error {
		dup, err = core.New(ctx, core.Config{Device: dev, Node: 2, Meta: []meta.Info{c.Node(1).MetaInfo()}})
		return err
	})
	if err == nil {
		dup.Close()
		t.Fatal("a second runtime took node id 2 from a live one")
	}
	if !errors.Is(err, meta.ErrNodeInUse) {
		t.Errorf("second node 2: %v, want meta.ErrNodeInUse", err)
	}
	if _, err := c.Node(1).Region(ctx(t), 2, "mine"); err != nil {
		t.Errorf("node 2's region after the refused duplicate: %v", err)
	}
}

// TestHostileDoneContexts passes contexts already cancelled or past their
// deadline to every blocking call: each returns at once with an error
// matching the context's, and New leaves nothing on its device.
func TestHostileDoneContexts(t *testing.T) {
	c := start(t, 3, core.Config{Credits: 1})
	a := c.Node(1)
	serve(t, c.Node(2), "r", 64)
	full := mustQueue(t, a, 2)
	g, err := full.Region(ctx(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	local, _ := a.RegMR(64, verbs.AccessAll)
	// Fill the queue's completion ring (4 credits' worth, none popped) so
	// the next Push must wait for a Pop that never comes.
	for range 4 {
		if _, err := full.Push(ctx(t), true, krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}); err != nil {
			t.Fatal(err)
		}
	}
	bound, _ := a.Queue()
	defer bound.Close()
	bound.Bind(3)
	calls := map[string]func(ctx context.Context) error{
		"Connect cold": func(ctx context.Context) error {
			q, _ := a.Queue()
			defer q.Close()
			return q.Connect(ctx, 3, nil) // never looked up: a READ of the MetaServer
		},
		"Region": func(ctx context.Context) error { _, err := a.Region(ctx, 2, "r"); return err },
		"Push wait": func(ctx context.Context) error {
			_, err := full.Push(ctx, true, krcore.Request{Op: verbs.OpWrite})
			return err
		},
		"PopMsgsWait": func(ctx context.Context) error {
			_, err := bound.PopMsgsWait(ctx, make([]krcore.Message, 1))
			return err
		},
		"Group.Wait": func(ctx context.Context) error { return a.Group().Wait(ctx, func() bool { return false }, nil) },
		"New": func(ctx context.Context) error {
			dev, err := c.Fabric.NewNode(soft.Config{})
			if err != nil {
				return err
			}
			defer dev.Close()
			rt, err := core.New(ctx, core.Config{Device: dev, Node: 9, Meta: []meta.Info{a.MetaInfo()}})
			if err == nil {
				rt.Close()
			} else if st := dev.Stats(); st.MRs+st.PDs+st.QPs+st.CQs+st.SRQs != 0 {
				return fmt.Errorf("a failed New left %+v: %w", st, err)
			}
			return err
		},
	}
	dones := map[string]func() (context.Context, context.CancelFunc){
		"cancelled": func() (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(context.Background())
			cancel()
			return c, cancel
		},
		"past deadline": func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Hour))
		},
	}
	for dname, done := range dones {
		for name, f := range calls {
			t.Run(dname+"/"+name, func(t *testing.T) {
				c, cancel := done()
				defer cancel()
				start := time.Now()
				err := bounded.Within(t, 3*time.Second, name, func() error { return f(c) })
				if !errors.Is(err, c.Err()) {
					t.Errorf("%s: %v, want %v", name, err, c.Err())
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("%s took %v with a done context", name, d)
				}
			})
		}
	}
}

// TestHostileCloseMidTraffic closes a runtime while goroutines push and
// pop READs and WRITEs on several VQs, wait for credits, messages, regions
// and a group: every one returns within a bound, each call after Close
// fails with ErrClosed, nothing panics, and the device holds nothing.
func TestHostileCloseMidTraffic(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 3, core.Config{Credits: 4})
		serve(t, c.Node(2), "r", 1<<16)
		if err := c.Add(ctx(t), m.config(4, core.Config{Credits: 4}), 4); err != nil {
			t.Fatal(err)
		}
		rt, dev := c.Node(4), c.Devices[len(c.Devices)-1]
		local, _ := rt.RegMR(1<<16, verbs.AccessAll)
		res := make(chan error, 64)
		var n int
		run := func(f func() error) {
			n++
			go func() { res <- f() }()
		}
		for i := range 4 {
			q, err := rt.Queue()
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Connect(ctx(t), 2, nil); err != nil {
				t.Fatal(err)
			}
			g, err := q.Region(ctx(t), "r")
			if err != nil {
				t.Fatal(err)
			}
			op := verbs.OpRead
			if i%2 == 1 {
				op = verbs.OpWrite
			}
			run(func() error { // push and pop until Close fails them
				out := make([]krcore.Completion, 8)
				for k := 0; ; k++ {
					r := krcore.Request{ID: uint64(k), Op: op, Local: local.Range(i*4096, 4096), Remote: g.At(uint64(i) * 4096)}
					if _, err := q.Push(context.Background(), true, r, r); err != nil {
						return err
					}
					if _, err := q.PopWait(context.Background(), out); err != nil {
						return err
					}
				}
			})
			run(func() error { // a second popper on the same VQ
				out := make([]krcore.Completion, 1)
				for {
					if _, err := q.PopWait(context.Background(), out); err != nil {
						return err
					}
				}
			})
		}
		bound, _ := rt.Queue()
		bound.Bind(44)
		run(func() error { _, err := bound.PopMsgsWait(context.Background(), make([]krcore.Message, 1)); return err })
		run(func() error { return rt.Group().Wait(context.Background(), func() bool { return false }, nil) })
		run(func() error { // control calls until Close fails them
			for {
				if _, err := rt.Region(context.Background(), 3, "none"); !errors.Is(err, krcore.ErrNoRegion) {
					return err
				}
			}
		})
		time.Sleep(50 * time.Millisecond) // let traffic flow; Close must end it whatever its state
		if err := bounded.Within(t, 5*time.Second, "Close", rt.Close); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(5 * time.Second)
		for range n {
			select {
			case err := <-res:
				if !errors.Is(err, krcore.ErrClosed) {
					t.Errorf("a call Close ended: %v, want ErrClosed", err)
				}
			case <-deadline:
				t.Fatal("a call still runs 5s after Close")
			}
		}
		if st := dev.Stats(); st.MRs+st.PDs+st.QPs+st.CQs+st.SRQs != 0 {
			t.Errorf("after Close the device still holds %+v", st)
		}
		if _, err := c.Node(1).Region(ctx(t), 2, "r"); err != nil {
			t.Errorf("the other nodes after node 4 closed: %v", err)
		}
	}, modeDC, modeNoDC)
}

// TestHostilePeerKilledMidTraffic kills a peer (its NIC first, as a
// crash) while VQs have READs in flight to it beside VQs reading from a
// live node on the same shared QPs: the requests to the dead node end with
// an error status within a bound, never SUCCESS without their bytes; the
// reads from the live node all succeed with their bytes; and a new
// request to the dead node fails fast.
func TestHostilePeerKilledMidTraffic(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		// The live node's READs must not time out while the machine is
		// starved: the dead node's fail after patientPath's 2 s all the same,
		// and the judgement of its death (core/dead.go: 480 ms on a runtime
		// that runs, up to 1.6 s by its timers on a starved one). Each
		// operation has 10 s: with 5 s, at nice 19 at load 13-20, an RC-only
		// READ to the dead node, pushed before the kill, ran out its context
		// as the judgement ended (the peer dead 3.6 s after the kill).
		c := m.start(t, 3, core.Config{Path: patientPath})
		a := c.Node(1)
		for _, id := range []krcore.NodeID{2, 3} {
			mr := serve(t, c.Node(id), "r", 4096)
			for i := range mr.Bytes() {
				mr.Bytes()[i] = byte(id)
			}
		}
		local, _ := a.RegMR(8*4096, verbs.AccessAll)
		type vq struct {
			q    *core.Queue
			g    krcore.Region
			node krcore.NodeID
		}
		var vqs []vq
		for i := range 8 {
			node := krcore.NodeID(2 + i%2)
			q := mustQueue(t, a, node)
			g, err := q.Region(ctx(t), "r")
			if err != nil {
				t.Fatal(err)
			}
			vqs = append(vqs, vq{q, g, node})
		}
		res := make(chan error, len(vqs))
		killed := make(chan struct{})
		for i, v := range vqs {
			go func() {
				buf := local.Bytes()[i*4096 : (i+1)*4096]
				out := make([]krcore.Completion, 1)
				for k := 0; ; k++ {
					clear(buf)
					c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := v.q.Push(c, true, krcore.Request{ID: uint64(k), Op: verbs.OpRead, Local: local.Range(i*4096, 4096), Remote: v.g.At(0)})
					if err == nil {
						_, err = v.q.PopWait(c, out)
					}
					cancel()
					switch {
					case err != nil:
						res <- fmt.Errorf("VQ to node %d: %w", v.node, err)
						return
					case out[0].Status != verbs.Success:
						if v.node == 3 {
							res <- fmt.Errorf("READ from the live node: %v", out[0].Err())
						} else {
							res <- nil // the dead node's request failed
						}
						return
					case buf[0] != byte(v.node) || buf[4095] != byte(v.node):
						res <- fmt.Errorf("READ %d from node %d: SUCCESS without its bytes", k, v.node)
						return
					}
					select {
					case <-killed:
						if v.node == 3 && k > 200 {
							res <- nil
							return
						}
					default:
					}
				}
			}()
		}
		time.Sleep(30 * time.Millisecond) // traffic flowing; the kill must find it in any state
		if err := c.Remove(2, true); err != nil {
			t.Fatal(err)
		}
		close(killed)
		deadline := time.After(15 * time.Second)
		for range vqs {
			select {
			case err := <-res:
				if err != nil {
					t.Error(err)
				}
			case <-deadline:
				t.Fatal("a VQ still waits 15s after its peer died")
			}
		}
		q, _ := a.Queue()
		defer q.Close()
		start := time.Now()
		err := withDeadline(t, 10*time.Second, "Connect to the dead node", func(ctx context.Context) error {
			if err := q.Connect(ctx, 2, nil); err != nil {
				return err
			}
			_, err := q.Push(ctx, true, krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: vqs[0].g.At(0)})
			if err != nil {
				return err
			}
			out := make([]krcore.Completion, 1)
			if _, err := q.PopWait(ctx, out); err != nil {
				return err
			}
			return out[0].Err()
		})
		if err == nil {
			t.Error("a READ from the dead node succeeded")
		}
		t.Logf("request to the dead node: %v after %v", err, time.Since(start))
	}, modeDC, modeNoDC)
}

// TestHostileMetaServerGone kills the node that embeds the MetaServer:
// nodes that know each other keep working, and a lookup only the
// MetaServer could answer fails within its context with an error, never
// hangs.
func TestHostileMetaServerGone(t *testing.T) {
	c := start(t, 4, core.Config{})
	b := c.Node(2)
	mr := serve(t, c.Node(3), "r", 64)
	copy(mr.Bytes(), "still here")
	q := mustQueue(t, b, 3)
	g, err := q.Region(ctx(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(1, true); err != nil {
		t.Fatal(err)
	}
	local, _ := b.RegMR(64, verbs.AccessAll)
	err = withDeadline(t, 5*time.Second, "READ between known nodes", func(ctx context.Context) error {
		if _, err := q.Push(ctx, true, krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 10), Remote: g.At(0)}); err != nil {
			return err
		}
		out := make([]krcore.Completion, 1)
		if _, err := q.PopWait(ctx, out); err != nil {
			return err
		}
		return out[0].Err()
	})
	if err != nil || string(local.Bytes()[:10]) != "still here" {
		t.Errorf("READ between nodes that know each other without the MetaServer: %v, %q", err, local.Bytes()[:10])
	}
	cold, _ := b.Queue()
	defer cold.Close()
	err = withDeadline(t, 3*time.Second, "cold Connect", func(ctx context.Context) error { return cold.Connect(ctx, 4, nil) })
	if err == nil {
		t.Log("cold Connect to node 4 succeeded without the MetaServer (a record cached meanwhile)")
	} else {
		t.Logf("cold Connect without the MetaServer: %v", err)
	}
	if err := bounded.Within(t, 5*time.Second, "Close without the MetaServer", b.Close); err != nil {
		t.Error(err)
	}
}

// TestHostileTwice does what may be done once twice: every second time
// is an error matching a sentinel, and the first stays intact.
func TestHostileTwice(t *testing.T) {
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	mr := serve(t, b, "r", 4096)
	copy(mr.Bytes(), "first")
	other, _ := b.RegMR(4096, verbs.AccessAll)
	if err := b.Export("r", other, 0, 64, verbs.AccessRemoteRead); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("Export of a taken name: %v, want ErrBusy", err)
	}
	long := strings.Repeat("x", 200)
	if err := b.Export(long, other, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Errorf("Export of a 200-byte name: %v", err)
	} else if _, err := a.Region(ctx(t), 2, long); err != nil {
		t.Errorf("Region of a 200-byte name: %v", err)
	}
	b.Unexport("never exported")
	b.Unexport(long)
	b.Unexport(long)
	if _, err := a.Region(ctx(t), 2, long); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("Region of a name unexported twice: %v, want ErrNoRegion", err)
	}
	gone, _ := b.RegMR(64, verbs.AccessAll)
	if err := b.Deregister(gone); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(gone); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("second Deregister: %v, want ErrClosed", err)
	}
	if err := b.Export("gone", gone, 0, 8, verbs.AccessRemoteRead); err == nil {
		t.Error("Export from a deregistered MR accepted")
	}
	q1, _ := b.Queue()
	defer q1.Close()
	q2, _ := b.Queue()
	defer q2.Close()
	if err := q1.Bind(5); err != nil {
		t.Fatal(err)
	}
	if err := q2.Bind(5); !errors.Is(err, krcore.ErrPortInUse) {
		t.Errorf("second Bind of a port: %v, want ErrPortInUse", err)
	}
	q1.Unbind()
	q1.Unbind()
	if err := q2.Bind(5); err != nil {
		t.Errorf("Bind of a port its queue unbound: %v", err)
	}
	q := mustQueue(t, a, 2)
	if err := q.Connect(ctx(t), 2, nil); err != nil {
		t.Errorf("Connect to the same node twice: %v", err)
	}
	if err := c.Add(ctx(t), modeDC.config(2, core.Config{}), 2); !errors.Is(err, cluster.ErrNodeExists) {
		t.Errorf("cluster Add of a running id: %v, want ErrNodeExists", err)
	}
	if err := c.Remove(9, false); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("cluster Remove of an id not running: %v", err)
	}
	g, err := q.Region(ctx(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	local, _ := a.RegMR(64, verbs.AccessAll)
	if _, err := q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 5), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	if wc := pop1(t, q); wc.Status != verbs.Success || string(local.Bytes()[:5]) != "first" {
		t.Errorf("READ of the first export after the refused second: %+v %q", wc, local.Bytes()[:5])
	}
	// A node connecting to itself reads its own export.
	self := mustQueue(t, b, 2)
	gs, err := self.Region(ctx(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	bl, _ := b.RegMR(64, verbs.AccessAll)
	if _, err := self.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: bl.Range(0, 5), Remote: gs.At(0)}); err != nil {
		t.Fatal(err)
	}
	if wc := pop1(t, self); wc.Status != verbs.Success || string(bl.Bytes()[:5]) != "first" {
		t.Errorf("READ of a node's own export: %+v %q", wc, bl.Bytes()[:5])
	}
}

// TestHostileBytesAfterRelease: an MR's Bytes after Deregister, or after
// its runtime closed, is empty: the memory RegMR allocated is unmapped,
// and a slice of it would fault the process when touched.
func TestHostileBytesAfterRelease(t *testing.T) {
	c := start(t, 2, core.Config{})
	rt := c.Node(2)
	mr, _ := rt.RegMR(64, verbs.AccessAll)
	if err := rt.Deregister(mr); err != nil {
		t.Fatal(err)
	}
	if n := len(mr.Bytes()); n != 0 {
		t.Errorf("Bytes after Deregister: %d bytes of unmapped memory", n)
	}
	kept, _ := rt.RegMR(64, verbs.AccessAll)
	if err := c.Remove(2, false); err != nil {
		t.Fatal(err)
	}
	if n := len(kept.Bytes()); n != 0 {
		t.Errorf("Bytes after the runtime closed: %d bytes of unmapped memory", n)
	}
}

// logCapture is a slog.Handler that keeps the messages logged.
type logCapture struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// TestHostileQuietClose: a Pop after Close and a node killed with exports
// are what Close and a crash are for: the runtime logs no error or
// warning about the CQ it closed or the exports its dead device took.
func TestHostileQuietClose(t *testing.T) {
	logs := &logCapture{}
	c := start(t, 3, core.Config{Logger: slog.New(logs)})
	serve(t, c.Node(2), "r", 64)
	rt := c.Node(3)
	q := mustQueue(t, rt, 1)
	if err := c.Remove(2, true); err != nil {
		t.Fatal(err)
	}
	// Node 2's poller may have met its device's death before Remove
	// closed its runtime: that failure is real and may be logged. From
	// here on only closed runtimes' CQs fail.
	logs.mu.Lock()
	killed := len(logs.msgs)
	logs.mu.Unlock()
	if err := c.Remove(3, false); err != nil {
		t.Fatal(err)
	}
	q.Pop(make([]krcore.Completion, 1))
	q.PopMsgs(make([]krcore.Message, 1))
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for i, m := range logs.msgs {
		if i >= killed && strings.Contains(m, "completion queue failed") || strings.Contains(m, "revoke export") {
			t.Errorf("logged %q", m)
		}
	}
}

// TestHostileConfig starts runtimes with sizes no device can give: New
// (or the Queue after it) fails with an error matching ErrInvalid or
// ErrLimit, never panics or allocates without bound.
func TestHostileConfig(t *testing.T) {
	c := start(t, 1, core.Config{})
	cases := map[string]core.Config{
		"Credits MaxInt":          {Credits: math.MaxInt},
		"Credits MaxInt/4":        {Credits: math.MaxInt / 4},
		"Credits 1<<40":           {Credits: 1 << 40},
		"Depth MaxInt":            {Depth: math.MaxInt},
		"DCIs 1<<30":              {DCIs: 1 << 30},
		"MaxMessage MaxInt":       {MaxMessage: math.MaxInt},
		"RecvSlots MaxInt":        {RecvSlots: math.MaxInt},
		"RecvSlots x MaxMessage":  {RecvSlots: 1 << 20, MaxMessage: 1 << 30},
		"RCPerPeer MaxInt":        {RCPerPeer: math.MaxInt, RCPeers: 2},
		"RCPeers MaxInt":          {RCPeers: math.MaxInt},
		"MetaSlots MaxInt":        {MetaSlots: math.MaxInt},
		"MetaBuckets negative":    {MetaBuckets: -1},
		"MetaBuckets beside Meta": {MetaBuckets: 64},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			dev, err := c.Fabric.NewNode(soft.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			cfg.Device, cfg.Node, cfg.Meta = dev, 5, []meta.Info{c.Node(1).MetaInfo()}
			var rt *core.Runtime
			err = withDeadline(t, 5*time.Second, "New", func(ctx context.Context) error {
				var err error
				rt, err = core.New(ctx, cfg)
				return err
			})
			if err == nil {
				defer rt.Close()
				var q *core.Queue
				if q, err = rt.Queue(); err == nil {
					q.Close()
					t.Logf("%s: accepted", name)
					return
				}
			}
			if !errors.Is(err, verbs.ErrInvalid) && !errors.Is(err, verbs.ErrLimit) {
				t.Errorf("%s: %v, want ErrInvalid or ErrLimit", name, err)
			}
		})
	}
}

// TestRegionRelearned: a region unexported and exported again under its
// name is a new grant; the handle learned before keeps the old one. Its
// READ, inside the old bounds, fails at the exporter (REM_ACCESS_ERR: the
// old registration is gone), and it is still held to its old record
// (a WRITE it never granted is refused before any QP); the handle learned
// again reads within the new bounds and is refused past them. Each request
// is pushed alone and popped with Pop (pushDirect, plain, completeOwn).
func TestRegionRelearned(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1})
		a, b := c.Node(1), c.Node(2)
		mr, _ := b.RegMR(4096, verbs.AccessAll)
		for i := range 64 {
			mr.Bytes()[i] = byte(i + 1)
		}
		if err := b.Export("x", mr, 0, 64, verbs.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
		q := mustQueue(t, a, 2)
		old, err := q.Region(ctx(t), "x")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(64, verbs.AccessAll)
		c0 := ctx(t)
		var out [2]krcore.Completion
		do := func(op verbs.Opcode, g krcore.Region, off uint64) krcore.Completion {
			t.Helper()
			clear(local.Bytes())
			if err := q.PushOne(c0, true, krcore.Request{ID: off, Op: op, Local: local.Range(0, 8), Remote: g.At(off)}); err != nil {
				t.Fatal(err)
			}
			for {
				if k := q.Pop(out[:]); k > 0 {
					if k != 1 || out[0].ID != off {
						t.Fatalf("%s at %d: Pop %+v", op, off, out[:k])
					}
					return out[0]
				}
				if c0.Err() != nil {
					t.Fatalf("%s at %d: no completion", op, off)
				}
				runtime.Gosched()
			}
		}
		if wc := do(verbs.OpRead, old, 40); wc.Status != verbs.Success || local.Bytes()[0] != 41 || local.Bytes()[7] != 48 {
			t.Fatalf("READ before: %+v %v", wc, local.Bytes()[:8])
		}
		if err := b.Unexport("x"); err != nil {
			t.Fatal(err)
		}
		if err := b.Export("x", mr, 0, 32, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
			t.Fatal(err)
		}
		again, err := q.Region(ctx(t), "x")
		if err != nil {
			t.Fatal(err)
		}
		refusals := a.Stats().Refusals
		for _, tc := range []struct {
			what string
			op   verbs.Opcode
			g    krcore.Region
			off  uint64
			want verbs.Status
		}{
			{"old handle, READ inside the old bounds", verbs.OpRead, old, 40, verbs.RemAccessErr},
			{"old handle, READ inside both", verbs.OpRead, old, 8, verbs.RemAccessErr},
			{"old handle, WRITE", verbs.OpWrite, old, 8, verbs.RemAccessErr},
			{"new handle, READ", verbs.OpRead, again, 8, verbs.Success},
			{"new handle, READ past the new end", verbs.OpRead, again, 40, verbs.RemAccessErr},
			{"new handle, WRITE", verbs.OpWrite, again, 16, verbs.Success},
		} {
			if wc := do(tc.op, tc.g, tc.off); wc.Status != tc.want {
				t.Errorf("%s: %+v, want %s", tc.what, wc, tc.want)
			}
		}
		// Refused before a QP: the old handle's WRITE (never granted)
		// and the new handle's READ past its end.
		if n := a.Stats().Refusals - refusals; n != 2 {
			t.Errorf("%d requests refused before a QP, want 2", n)
		}
	}, modeDC, modeNoDC)
}

// TestReconnectDirect: a queue that read node 2's region with requests
// pushed alone (pushDirect, on the route it cached) and is connected to
// node 3 takes the general path once, to its new route: node 2's region
// is refused (not read through the old route), node 3's is read from node
// 3; connected back, it reads node 2's again. DC and RC-only modes.
func TestReconnectDirect(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 3, core.Config{})
		a := c.Node(1)
		m2 := serve(t, c.Node(2), "d", 64)
		m3 := serve(t, c.Node(3), "d", 64)
		copy(m2.Bytes(), "node2...")
		copy(m3.Bytes(), "node3...")
		g2, err := a.Region(ctx(t), 2, "d")
		if err != nil {
			t.Fatal(err)
		}
		g3, err := a.Region(ctx(t), 3, "d")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(64, verbs.AccessAll)
		q := mustQueue(t, a, 2)
		one := func(r krcore.Request) krcore.Completion {
			t.Helper()
			clear(local.Bytes()[:8])
			if err := q.PushOne(ctx(t), true, r); err != nil {
				t.Fatal(err)
			}
			var out [1]krcore.Completion
			if _, err := q.PopWait(ctx(t), out[:]); err != nil {
				t.Fatal(err)
			}
			return out[0]
		}
		for i := 0; i < 3; i++ {
			if c := one(krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g2.At(0)}); c.Status != verbs.Success || string(local.Bytes()[:8]) != "node2..." {
				t.Fatalf("node 2: %+v %q", c, local.Bytes()[:8])
			}
		}
		if err := q.Connect(ctx(t), 3, nil); err != nil {
			t.Fatal(err)
		}
		if c := one(krcore.Request{ID: 2, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g2.At(0)}); c.Status == verbs.Success {
			t.Fatalf("node 2's region after connecting to 3: %+v %q", c, local.Bytes()[:8])
		}
		for i := 0; i < 3; i++ {
			if c := one(krcore.Request{ID: 3, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g3.At(0)}); c.Status != verbs.Success || string(local.Bytes()[:8]) != "node3..." {
				t.Fatalf("node 3: %+v %q", c, local.Bytes()[:8])
			}
		}
		if err := q.Connect(ctx(t), 2, nil); err != nil {
			t.Fatal(err)
		}
		if c := one(krcore.Request{ID: 4, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g2.At(0)}); c.Status != verbs.Success || string(local.Bytes()[:8]) != "node2..." {
			t.Fatalf("node 2 again: %+v %q", c, local.Bytes()[:8])
		}
	}, modeDC, modeNoDC)
}

// TestHostileSends pushes SENDs whose local buffer is forged in every way
// a caller can, each between two good SENDs on a queue connected to a
// port, as one batch (Push) and one at a time (PushOne: the path that
// accepts a request straight into its QP's ring, pushDirect): the forged
// SEND completes with an error status in its place and never reaches a
// shared QP, and the receiver gets the good messages only, in order.
func TestHostileSends(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		// patientPath: a good SEND that times out under load would count
		// as a recovery, which the test takes for a forged one's.
		c := m.start(t, 2, core.Config{Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		srv, cli := portPair(t, c)
		local, _ := a.RegMR(4096, verbs.AccessAll)
		copy(local.Bytes(), "0123456789abcdef")
		foreign, _ := b.RegMR(4096, verbs.AccessAll)
		gone, _ := a.RegMR(4096, verbs.AccessAll)
		a.Deregister(gone)
		bad := map[string]krcore.Local{
			"nil MR":           {Len: 8},
			"zero MR":          {MR: &core.MR{}, Len: 8},
			"foreign MR":       foreign.Range(0, 8),
			"deregistered MR":  gone.Range(0, 8),
			"negative off":     local.Range(-8, 8),
			"negative len":     local.Range(0, -8),
			"off MaxInt":       local.Range(math.MaxInt, 8),
			"len MaxInt":       local.Range(8, math.MaxInt),
			"off+len overflow": local.Range(math.MaxInt-2, 8),
			"past MR end":      local.Range(4090, 8),    // would travel in its header slot
			"large past end":   local.Range(1024, 4000), // would be gathered from the MR
		}
		pushes := map[string]func(ctx context.Context, reqs []krcore.Request) error{
			"Push": func(ctx context.Context, reqs []krcore.Request) error {
				_, err := cli.Push(ctx, true, reqs...)
				return err
			},
			"PushOne": func(ctx context.Context, reqs []krcore.Request) error {
				for _, r := range reqs {
					if err := cli.PushOne(ctx, true, r); err != nil {
						return err
					}
				}
				return nil
			},
		}
		imm := uint32(0) // the good SENDs' immediates, in the order sent
		next := uint32(1)
		for how, push := range pushes {
			for name, l := range bad {
				for _, op := range []verbs.Opcode{verbs.OpSend, verbs.OpSendImm} {
					what := fmt.Sprintf("%s %s %s", how, op, name)
					good := func(id uint64) krcore.Request {
						imm++
						return krcore.Request{ID: id, Op: verbs.OpSendImm, Imm: imm, Local: local.Range(0, 8)}
					}
					reqs := []krcore.Request{good(1), {ID: 2, Op: op, Imm: 1 << 30, Local: l}, good(3)}
					err := withDeadline(t, 5*time.Second, what, func(ctx context.Context) error {
						if err := push(ctx, reqs); err != nil {
							return err
						}
						var out [3]krcore.Completion
						for got := 0; got < 3; {
							n, err := cli.PopWait(ctx, out[got:])
							if err != nil {
								return err
							}
							got += n
						}
						if out[0].ID != 1 || out[0].Status != verbs.Success || out[2].ID != 3 || out[2].Status != verbs.Success {
							return fmt.Errorf("the good SENDs around it: %+v %+v", out[0], out[2])
						}
						if out[1].ID != 2 || out[1].Status == verbs.Success {
							return fmt.Errorf("completed %+v, want an error status", out[1])
						}
						var msgs [2]krcore.Message
						for got := 0; got < 2; {
							n, err := srv.PopMsgsWait(ctx, msgs[got:])
							if err != nil {
								return err
							}
							got += n
						}
						for _, msg := range msgs {
							if !msg.HasImm || msg.Imm != next || string(msg.Data) != "01234567" {
								return fmt.Errorf("received %+v, want the good SEND %d", msg, next)
							}
							next++
						}
						return nil
					})
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
			}
		}
		if st := a.Stats(); st.Recoveries != 0 || st.PostErrors != 0 {
			t.Errorf("forged SENDs reached a shared QP: %+v", st)
		}
		if st := b.Stats(); st.Dropped != 0 {
			t.Errorf("the receiver dropped messages: %+v", st)
		}
	}, modeDC, modeNoDC)
}

// TestHostileAfterPlain: a request naming the MR, region and opcode of the
// last one a queue let through in one pass is checked in less (its ranges
// and its MR's life; see Queue.quick), the rest having been decided for
// the queue's connection. Nothing decided for one connection holds for
// another, or past a change of what the request names: each forged
// request below comes right after a good one with the same handles and
// opcode and is refused with the status a fresh queue gives it, and none
// reaches a shared QP.
func TestHostileAfterPlain(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 3, core.Config{Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "data", 4096)
		serve(t, c.Node(3), "data", 4096)
		roMR, _ := b.RegMR(4096, verbs.AccessAll)
		if err := b.Export("ro", roMR, 0, 64, verbs.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
		srv, q := portPair(t, c)
		g, err := q.Region(ctx(t), "data")
		if err != nil {
			t.Fatal(err)
		}
		ro, err := q.Region(ctx(t), "ro")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(4096, verbs.AccessAll)
		doomed, _ := a.RegMR(4096, verbs.AccessAll)
		run := func(what string, want verbs.Status, reqs ...krcore.Request) {
			t.Helper()
			var out [2]krcore.Completion
			err := withDeadline(t, 5*time.Second, what, func(ctx context.Context) error {
				if _, err := q.Push(ctx, true, reqs...); err != nil {
					return err
				}
				for got := 0; got < len(reqs); {
					n, err := q.PopWait(ctx, out[got:len(reqs)])
					if err != nil {
						return err
					}
					got += n
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if last := out[len(reqs)-1]; last.Status != want {
				t.Errorf("%s: completed %+v, want %s", what, last, want)
			}
		}
		read := func(l krcore.Local, r krcore.Remote) krcore.Request {
			return krcore.Request{ID: 1, Op: verbs.OpRead, Local: l, Remote: r}
		}
		send := krcore.Request{ID: 1, Op: verbs.OpSend, Local: local.Range(0, 8)}
		rbuf, _ := b.RegMR(4096, verbs.AccessAll)
		if err := srv.PushRecv(rbuf.Range(0, 64)); err != nil {
			t.Fatal(err)
		}
		run("a SEND to the port", verbs.Success, send)
		if err := q.Connect(ctx(t), 2, nil); err != nil {
			t.Fatal(err)
		}
		run("a SEND after a reconnect without the port", verbs.LocQPOpErr, send)

		write := read(local.Range(0, 8), ro.At(0))
		write.Op = verbs.OpWrite
		run("a WRITE of a read-only region after a READ of it", verbs.RemAccessErr, read(local.Range(0, 8), ro.At(0)), write)
		run("a READ past the region after one inside", verbs.RemAccessErr, read(local.Range(0, 8), g.At(0)), read(local.Range(0, 8), g.At(4089)))
		run("a READ past the MR after one inside", verbs.LocProtErr, read(local.Range(0, 8), g.At(0)), read(local.Range(4089, 8), g.At(0)))

		run("a READ into an MR about to go", verbs.Success, read(doomed.Range(0, 8), g.At(0)))
		if err := a.Deregister(doomed); err != nil {
			t.Fatal(err)
		}
		run("a READ into it deregistered", verbs.LocProtErr, read(doomed.Range(0, 8), g.At(0)))

		// A Region is a value whose copies share its record: overwriting
		// the one a handle points at changes what the handle names.
		reused, err := a.Region(ctx(t), 2, "data")
		if err != nil {
			t.Fatal(err)
		}
		small, err := a.Region(ctx(t), 2, "ro")
		if err != nil {
			t.Fatal(err)
		}
		run("a READ of a handle about to be overwritten", verbs.Success, read(local.Range(0, 8), reused.At(100)))
		*reused = *small
		run("the READ past the region written over it", verbs.RemAccessErr, read(local.Range(0, 8), reused.At(100)))
		run("a READ of the handle again", verbs.Success, read(local.Range(0, 8), reused.At(0)))
		*reused = core.Region{}
		run("the READ of the zero Region written over it", verbs.RemInvReqErr, read(local.Range(0, 8), reused.At(0)))

		// So is an MR: overwritten with another runtime's, or with one
		// without LOCAL_WRITE, the handle names that one (written through
		// reflect, as go vet refuses a copy of its locks; put back after).
		victim, _ := a.RegMR(4096, verbs.AccessAll)
		foreign, _ := b.RegMR(4096, verbs.AccessAll)
		noWrite, _ := a.RegMR(4096, verbs.AccessRemoteRead)
		for _, other := range []struct {
			name string
			mr   *core.MR
		}{{"another runtime's MR", foreign}, {"an MR without LOCAL_WRITE", noWrite}} {
			run("a READ into an MR about to be overwritten", verbs.Success, read(victim.Range(0, 8), g.At(0)))
			v := reflect.ValueOf(victim).Elem()
			saved := reflect.New(v.Type()).Elem()
			saved.Set(v)
			v.Set(reflect.ValueOf(other.mr).Elem())
			run("the READ into "+other.name+" written over it", verbs.LocProtErr, read(victim.Range(0, 8), g.At(0)))
			v.Set(saved)
		}

		run("a READ of node 2's region", verbs.Success, read(local.Range(0, 8), g.At(0)))
		if err := q.Connect(ctx(t), 3, nil); err != nil {
			t.Fatal(err)
		}
		run("the READ after a reconnect to node 3", verbs.RemAccessErr, read(local.Range(0, 8), g.At(0)))
		if st := a.Stats(); st.Recoveries != 0 || st.PostErrors != 0 {
			t.Errorf("forged requests reached a shared QP: %+v", st)
		}
	}, modeDC, modeNoDC)
}

// TestHostileAfterPlainConcurrent: goroutines pushing on one queue at once,
// alone and in batches, good READs (which a queue remembers, see
// Queue.quick) interleaved with READs of the same handles past the region
// or the MR: whatever the interleaving, every forged request is refused
// with its status and every good one succeeds, and none reaches a shared
// QP.
func TestHostileAfterPlainConcurrent(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "data", 4096)
		q := mustQueue(t, a, 2)
		g, err := q.Region(ctx(t), "data")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(4096, verbs.AccessAll)
		// By ID: 3k good, 3k+1 past the region, 3k+2 past the MR.
		want := []verbs.Status{verbs.Success, verbs.RemAccessErr, verbs.LocProtErr}
		req := func(id uint64) krcore.Request {
			r := krcore.Request{ID: id, Op: verbs.OpRead, Local: local.Range(int(id%64)*8, 8), Remote: g.At(id % 64 * 8)}
			switch id % 3 {
			case 1:
				r.Remote = g.At(4090)
			case 2:
				r.Local = local.Range(4090, 8)
			}
			return r
		}
		const pushers, each = 3, 150
		var wg sync.WaitGroup
		for p := range pushers {
			wg.Go(func() {
				for i := 0; i < each; {
					id := uint64(p*each + i)
					reqs := []krcore.Request{req(id)}
					if p == 0 && i+3 <= each { // batches: pushRun's path
						reqs = append(reqs, req(id+1), req(id+2))
					}
					if _, err := q.Push(ctx(t), true, reqs...); err != nil {
						t.Error(err)
						return
					}
					i += len(reqs)
				}
			})
		}
		out := make([]krcore.Completion, 16)
		for got := 0; got < pushers*each; {
			n, err := q.PopWait(ctx(t), out)
			if err != nil {
				t.Errorf("after %d completions: %v", got, err)
				break // the pushers end at their deadline
			}
			for _, cp := range out[:n] {
				if w := want[cp.ID%3]; cp.Status != w {
					t.Errorf("request %d completed %+v, want %s", cp.ID, cp, w)
				}
			}
			got += n
		}
		wg.Wait()
		if st := a.Stats(); st.Recoveries != 0 || st.PostErrors != 0 {
			t.Errorf("forged requests reached a shared QP: %+v", st)
		}
	}, modeDC, modeNoDC)
}
