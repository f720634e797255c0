package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect makes a VQ of api connected to node 2 and learns "table".
func connect(t testing.TB, ctx context.Context, api krcore.API) (krcore.VQ, krcore.Region) {
	t.Helper()
	q, err := api.Queue()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "table")
	if err != nil {
		t.Fatal(err)
	}
	return q, g
}

// run pushes reqs and waits for their completions.
func run(t testing.TB, ctx context.Context, q krcore.VQ, reqs ...krcore.Request) []krcore.Completion {
	t.Helper()
	if _, err := q.Push(ctx, true, reqs...); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range reqs {
		if !reqs[i].Unsignaled {
			want++
		}
	}
	var out []krcore.Completion
	buf := make([]krcore.Completion, 16)
	for len(out) < want {
		n, err := q.PopWait(ctx, buf)
		if err != nil {
			t.Fatalf("after %d completions: %v", len(out), err)
		}
		out = append(out, buf[:n]...)
	}
	return out
}

// TestOneSided: READ, WRITE and atomics through the rings, the same code
// on the embedded runtime and on the daemon.
func TestOneSided(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	for name, api := range map[string]krcore.API{"embedded": core.Embed(e.c.Node(1)), "daemon": attach(t, e)} {
		t.Run(name, func(t *testing.T) {
			q, g := connect(t, ctx, api)
			buf, err := api.RegMR(4096, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			defer api.Deregister(buf)
			copy(buf.Bytes()[64:], "written by "+name)
			out := run(t, ctx, q,
				krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: g.At(0)},
				krcore.Request{ID: 2, Op: verbs.OpWrite, Local: buf.Range(64, 32), Remote: g.At(1024), Unsignaled: true},
				krcore.Request{ID: 3, Op: verbs.OpFetchAdd, Local: buf.Range(128, 8), Remote: g.At(2048), Compare: 5},
				krcore.Request{ID: 4, Op: verbs.OpWrite, Local: buf.Range(96, 20), Remote: g.At(1100)},
			)
			if len(out) != 3 || out[0].ID != 1 || out[1].ID != 3 || out[2].ID != 4 || out[0].Err() != nil || out[1].Err() != nil || out[2].Err() != nil {
				t.Fatalf("completions %+v", out)
			}
			for i, want := range []int{17, 8, 20} { // the bytes each moved
				if out[i].Len != want {
					t.Errorf("request %d (%s): Len %d, want %d", out[i].ID, out[i].Op, out[i].Len, want)
				}
			}
			if got := string(buf.Bytes()[:17]); got != "hello from node 2" {
				t.Errorf("READ got %q", got)
			}
			if got := string(e.table.Bytes()[1024 : 1024+len("written by "+name)]); got != "written by "+name {
				t.Errorf("WRITE left %q", got)
			}
			if q.Outstanding() != 0 {
				t.Errorf("outstanding %d", q.Outstanding())
			}
		})
	}
	if v := binary.LittleEndian.Uint64(e.table.Bytes()[2048:]); v != 10 {
		t.Errorf("two FAA of 5 left %d", v)
	}
}

// TestMessages: a daemon client binds a port, node 2 sends to it and the
// client replies; messages land in posted buffers or come as copies.
func TestMessages(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	srv, err := e.c.Node(2).Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Bind(80)
	srvMR, _ := e.c.Node(2).RegMR(256, verbs.AccessLocalWrite)
	srv.PushRecv(srvMR.Range(0, 256))

	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Bind(7); err != nil {
		t.Fatal(err)
	}
	inbox, _ := c.RegMR(256, verbs.AccessLocalWrite)
	if err := q.PushRecv(inbox.Range(0, 128)); err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(ctx, 2, &krcore.ConnectOptions{Port: 80}); err != nil {
		t.Fatal(err)
	}
	n := copy(inbox.Bytes()[128:], "ping")
	if out := run(t, ctx, q, krcore.Request{ID: 9, Op: verbs.OpSend, Local: inbox.Range(128, n)}); out[0].Err() != nil {
		t.Fatal(out[0].Err())
	}
	var m [1]krcore.Message
	if _, err := srv.PopMsgsWait(ctx, m[:]); err != nil {
		t.Fatal(err)
	}
	if string(srvMR.Bytes()[:m[0].Len]) != "ping" || m[0].From != 1 || m[0].Port != 7 {
		t.Fatalf("node 2 got %+v %q", m[0], srvMR.Bytes()[:m[0].Len])
	}
	// two replies: the first lands in the posted buffer, the second is copied
	srv.Connect(ctx, 1, &krcore.ConnectOptions{Port: 7})
	for i, s := range []string{"pong", "late"} {
		copy(srvMR.Bytes()[200:], s)
		srv.Push(ctx, true, krcore.Request{ID: uint64(i), Op: verbs.OpSendImm, Imm: 42, Local: srvMR.Range(200, 4)})
		var out [1]krcore.Completion
		if _, err := srv.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			t.Fatal(err, out[0].Err())
		}
	}
	var got []krcore.Message
	for len(got) < 2 {
		var ms [2]krcore.Message
		k, err := q.PopMsgsWait(ctx, ms[:])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ms[:k]...)
	}
	if got[0].Buf == nil || string(inbox.Bytes()[:got[0].Len]) != "pong" || !got[0].HasImm || got[0].Imm != 42 || got[0].From != 2 {
		t.Errorf("first reply %+v", got[0])
	}
	if got[1].Buf != nil || string(got[1].Data) != "late" {
		t.Errorf("second reply %+v", got[1])
	}
}

// TestIsolation: two clients each see only their own completions; one
// naming the other's MR or region is refused on its own VQ only, while the
// other's traffic never fails.
func TestIsolation(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	a, b := attach(t, e), attach(t, e)
	qa, ga := connect(t, ctx, a)
	qb, gb := connect(t, ctx, b)
	bufA, _ := a.RegMR(4096, verbs.AccessAll)
	bufB, _ := b.RegMR(4096, verbs.AccessAll)
	stolenMR := client.StealMR(b, bufA)
	stolenRegion := client.StealRegion(b, ga)

	var wg sync.WaitGroup
	var failures atomic.Int64
	wg.Add(1)
	go func() { // A: clean READs, IDs 1000+
		defer wg.Done()
		for i := range 300 {
			out := run(t, ctx, qa, krcore.Request{ID: 1000 + uint64(i), Op: verbs.OpRead, Local: bufA.Range(0, 8), Remote: ga.At(0)})
			if out[0].ID != 1000+uint64(i) || out[0].Err() != nil {
				failures.Add(1)
				t.Errorf("A got %+v", out[0])
			}
		}
	}()
	for i := range 100 { // B: attacks mixed with its own work
		out := run(t, ctx, qb,
			krcore.Request{ID: 1, Op: verbs.OpRead, Local: stolenMR.Range(0, 8), Remote: gb.At(0)},
			krcore.Request{ID: 2, Op: verbs.OpRead, Local: bufB.Range(0, 8), Remote: stolenRegion.At(0)},
			krcore.Request{ID: 3, Op: verbs.OpWrite, Local: bufB.Range(0, 8), Remote: gb.At(4090)},
			krcore.Request{ID: 4, Op: verbs.OpRead, Local: bufB.Range(0, 8), Remote: gb.At(0)},
		)
		want := []verbs.Status{verbs.LocProtErr, verbs.RemInvReqErr, verbs.RemAccessErr, verbs.Success}
		for j, w := range want {
			if out[j].ID != uint64(j+1) || out[j].Status != w {
				t.Fatalf("round %d: B completion %d = %+v, want %s", i, j, out[j], w)
			}
		}
	}
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d of A's requests failed", failures.Load())
	}
	for _, cs := range e.srv.Status().Clients {
		if cs.ID == b.ID() && cs.Refusals < 200 {
			t.Errorf("B's refusals counted %d, want >= 200", cs.Refusals)
		}
	}
	if err := b.Deregister(stolenMR); !errors.Is(err, krcore.ErrRefused) {
		t.Errorf("B deregistering A's MR: %v, want ErrRefused", err)
	}
	if err := b.Export("stolen", stolenMR, 0, 8, verbs.AccessRemoteRead); !errors.Is(err, krcore.ErrRefused) {
		t.Errorf("B exporting A's MR: %v, want ErrRefused", err)
	}
	if err := a.Export("mine", bufA, 0, 8, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if err := b.Unexport("mine"); !errors.Is(err, krcore.ErrRefused) {
		t.Errorf("B withdrawing A's export: %v, want ErrRefused", err)
	}
}

func fdCount(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestKillReclaim: a client process SIGKILLed mid-traffic leaves nothing in
// the daemon (its VQs and MRs gone, the daemon's descriptors back to where
// they were) while another client keeps working without a failure.
func TestKillReclaim(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	b := attach(t, e)
	qb, gb := connect(t, ctx, b)
	bufB, _ := b.RegMR(64, verbs.AccessAll)
	baseVQs := e.c.Node(1).Stats().VQs
	baseFDs := fdCount(t)

	stop := make(chan struct{})
	var done atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // B's traffic through the whole kill
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			out := run(t, ctx, qb, krcore.Request{ID: i, Op: verbs.OpRead, Local: bufB.Range(0, 8), Remote: gb.At(0)})
			if out[0].Err() != nil || out[0].ID != i {
				t.Errorf("B: %+v", out[0])
				return
			}
			done.Add(1)
		}
	}()

	child := startChild(t, e.sock)
	var pushes uint64
	waitFor(t, "child traffic", func() bool {
		for _, cs := range e.srv.Status().Clients {
			if int(cs.PID) == child.Process.Pid && len(cs.VQs) == 2 && cs.MRs == 1 && cs.Pushes > 100 {
				pushes = cs.Pushes
				return true
			}
		}
		return false
	})
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	waitFor(t, "reclaim", func() bool {
		return len(e.srv.Status().Clients) == 1 && e.c.Node(1).Stats().VQs == baseVQs && fdCount(t) == baseFDs
	})
	before := done.Load()
	waitFor(t, "B still running", func() bool { return done.Load() > before+100 })
	close(stop)
	wg.Wait()
	t.Logf("child pushed %d before SIGKILL; B completed %d READs, none failed", pushes, done.Load())
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling the daemon's state, not standing in for a cost
	}
}

// TestDaemonGone: a daemon stopping fails calls with krcore.ErrDaemonGone and
// flushes requests in flight; attaching to the next daemon works.
func TestDaemonGone(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	q, g := connect(t, ctx, c)
	buf, _ := c.RegMR(64, verbs.AccessAll)
	run(t, ctx, q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})

	e.stop()
	var out [4]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("PopWait: %v, want krcore.ErrDaemonGone", err)
	}
	if _, err := q.Push(ctx, true, krcore.Request{ID: 2, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("Push: %v, want krcore.ErrDaemonGone", err)
	}
	if _, err := c.Queue(); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("Queue: %v, want krcore.ErrDaemonGone", err)
	}
	if _, err := c.RegMR(64, verbs.AccessAll); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("RegMR: %v, want krcore.ErrDaemonGone", err)
	}
	if _, err := client.Attach(ctx, client.Options{Socket: e.sock}); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("Attach with no daemon: %v, want krcore.ErrDaemonGone", err)
	}

	e.start(t)
	c2 := attach(t, e)
	q2, g2 := connect(t, ctx, c2)
	buf2, _ := c2.RegMR(64, verbs.AccessAll)
	if out := run(t, ctx, q2, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf2.Range(0, 8), Remote: g2.At(0)}); out[0].Err() != nil {
		t.Fatal(out[0].Err())
	}
}

// TestFlushOnGone: requests the daemon never finished complete with
// WR_FLUSH_ERR once it is gone.
func TestFlushOnGone(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	q, g := connect(t, ctx, c)
	buf, _ := c.RegMR(64, verbs.AccessAll)
	// unsignaled successes never complete: they stay outstanding until a
	// signaled request retires them, so the daemon's end flushes them
	reqs := []krcore.Request{
		{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0), Unsignaled: true},
		{ID: 2, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0), Unsignaled: true},
	}
	if _, err := q.Push(ctx, true, reqs...); err != nil {
		t.Fatal(err)
	}
	e.stop()
	out := make([]krcore.Completion, 4)
	n, err := q.PopWait(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.PopWait(ctx, out[n:]); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("PopWait with nothing left: %v, want krcore.ErrDaemonGone", err)
	}
	if n != 2 || out[0].Status != verbs.WRFlushErr || out[1].ID != 2 {
		t.Fatalf("after the daemon went: %d %+v", n, out[:n])
	}
}

// TestDenied: a peer whose uid is not allowed cannot attach.
func TestDenied(t *testing.T) {
	e := startEnv(t)
	e.stop()
	srv, err := daemon.New(e.c.Node(1), daemon.Config{Socket: e.sock, Logger: quiet, AllowUIDs: []uint32{uint32(os.Getuid()) + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve(context.Background())
	if _, err := client.Attach(ctxT(t), client.Options{Socket: e.sock}); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Fatalf("attach as a refused uid: %v", err)
	}
}

// TestStalledVQ: a VQ whose completions are never popped fills its rings
// and credits; the daemon's pump, which serves all of a client's VQs, keeps
// serving the client's other VQ.
func TestStalledVQ(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	stalled, g := connect(t, ctx, c)
	live, _ := connect(t, ctx, c)
	buf, _ := c.RegMR(64, verbs.AccessAll)
	read := krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}
	pushed := 0
	for {
		n, err := stalled.Push(ctx, false, read)
		pushed += n
		if errors.Is(err, krcore.ErrNoCredit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		read.ID = uint64(i)
		if cs := run(t, ctx, live, read); cs[0].ID != uint64(i) || cs[0].Err() != nil {
			t.Fatalf("READ %d on the live VQ: %+v", i, cs[0])
		}
	}
	out := make([]krcore.Completion, pushed)
	got := 0
	for got < pushed {
		n, err := stalled.PopWait(ctx, out[got:])
		if err != nil {
			t.Fatalf("stalled VQ after %d of %d completions: %v", got, pushed, err)
		}
		got += n
	}
	// The credits came back: the VQ takes requests again (the client
	// rereads the daemon's retired counter only when its copy says full).
	for i := range 2 * pushed {
		read.ID = uint64(i)
		if cs := run(t, ctx, stalled, read); cs[0].Err() != nil {
			t.Fatalf("READ %d on the drained VQ: %+v", i, cs[0])
		}
	}
	t.Logf("%d READs held on the stalled VQ; the live one ran 100", pushed)
}
