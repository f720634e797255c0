package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestTwoWaitersOneQueue: one goroutine waits for a queue's completions
// while another waits for its messages, as krcored's completer and
// messenger do. A SEND's completion and the echo it provokes arrive close
// together; each waiter must be woken for its own, every time.
func TestTwoWaitersOneQueue(t *testing.T) {
	_, rts := tcpRuntimes(t, 2, core.Config{})
	a, b := rts[0], rts[1]
	echo, _ := b.Queue()
	defer echo.Close()
	if err := echo.Bind(7); err != nil {
		t.Fatal(err)
	}
	ebuf, _ := b.RegMR(64, verbs.AccessLocalWrite)
	if err := echo.Connect(ctx(t), 1, &krcore.ConnectOptions{Port: 8}); err != nil {
		t.Fatal(err)
	}
	q := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 7})
	if err := q.Bind(8); err != nil {
		t.Fatal(err)
	}
	msg, _ := a.RegMR(64, verbs.AccessLocalWrite)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the echo
		var ms [1]krcore.Message
		var cs [4]krcore.Completion
		for {
			if _, err := echo.PopMsgsWait(cctx, ms[:]); err != nil {
				return
			}
			echo.Push(cctx, true, krcore.Request{Op: verbs.OpSend, Local: ebuf.Range(0, 8)})
			echo.Pop(cs[:])
		}
	}()
	// Idle queues whose waiters sleep on the same completion queues, so
	// q's waiters often sleep aside, on q's own wake-up.
	for port := uint32(20); port < 23; port++ {
		idle := mustQueue(t, a, 2)
		if err := idle.Bind(port); err != nil {
			t.Fatal(err)
		}
		go func() {
			var cs [1]krcore.Completion
			idle.PopWait(cctx, cs[:])
		}()
		go func() {
			var ms [1]krcore.Message
			idle.PopMsgsWait(cctx, ms[:])
		}()
	}
	comps, msgs := make(chan error, 1), make(chan error, 1)
	go func() {
		var cs [1]krcore.Completion
		for {
			_, err := q.PopWait(cctx, cs[:])
			if cctx.Err() != nil {
				return
			}
			comps <- err
		}
	}()
	go func() {
		var ms [1]krcore.Message
		for {
			_, err := q.PopMsgsWait(cctx, ms[:])
			if cctx.Err() != nil {
				return
			}
			msgs <- err
		}
	}()
	const rounds = 2000
	for i := range rounds {
		if _, err := q.Push(ctx(t), true, krcore.Request{ID: uint64(i), Op: verbs.OpSend, Local: msg.Range(0, 8)}); err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			what string
			ch   chan error
		}{{"completion", comps}, {"echo", msgs}} {
			select {
			case err := <-w.ch:
				if err != nil {
					t.Fatalf("round %d: %s: %v", i, w.what, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d of %d: no %s: a waiter was never woken", i, rounds, w.what)
			}
		}
	}
}

// tcpRuntimes starts n runtimes, configured like tmpl, on soft RNICs that
// reach each other only over TCP (loopback), as separate processes would:
// unlike the in-memory wire, where an 8 B READ completes inside PostSend in
// a few hundred ns of pure CPU, a request here waits for a real wire, and
// completions arrive at their own times, as on an RNIC.
func tcpRuntimes(tb testing.TB, n int, tmpl core.Config) (devs []verbs.Device, rts []*core.Runtime) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		dev, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { dev.Close() })
		cfg := tmpl
		cfg.Device, cfg.Node = dev, krcore.NodeID(i+1)
		if i > 0 {
			cfg.Meta = []meta.Info{rts[0].MetaInfo()}
		}
		rt, err := core.New(ctx, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { rt.Close() })
		devs, rts = append(devs, dev), append(rts, rt)
	}
	return devs, rts
}

// TestWaitContexts: the end of a waiter's context reaches it while it
// sleeps on the completion queue, and the end of a context that an
// earlier waiter used (whose registration the poller keeps for the next
// sleep) only wakes the current sleeper for nothing: it keeps waiting and
// gets its completion.
func TestWaitContexts(t *testing.T) {
	_, rts := tcpRuntimes(t, 2, core.Config{})
	q, req := vqReader(t, rts[0], rts[1])
	var out [1]krcore.Completion

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := q.PopWait(short, out[:]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PopWait with nothing in flight and a 50ms deadline: %v, want DeadlineExceeded", err)
	}

	earlier, cancelEarlier := context.WithCancel(context.Background())
	if _, err := q.Push(earlier, false, req); err != nil {
		t.Fatal(err)
	}
	if _, err := q.PopWait(earlier, out[:]); err != nil || out[0].Status != verbs.Success {
		t.Fatalf("first READ: %v %v", err, out[0].Status)
	}

	later, cancelLater := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLater()
	res := make(chan error, 1)
	go func() {
		_, err := q.PopWait(later, out[:])
		res <- err
	}()
	cancelEarlier()
	select {
	case err := <-res:
		t.Fatalf("the waiter returned (%v) when an earlier waiter's context ended, with nothing done", err)
	case <-time.After(50 * time.Millisecond):
	}
	req.ID = 2
	if _, err := q.Push(later, false, req); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil || out[0].ID != 2 || out[0].Status != verbs.Success {
		t.Fatalf("second READ: %v, completion %+v", err, out[0])
	}
}

// TestPopBesideWaiter: one goroutine pushes requests one at a time and
// spins on the queue's Pop, whose poll takes the queue's own completions
// for itself (completeOwn, finishOwn), while another sleeps in PopWait on
// the same queue and an idle queue's waiter contends for the completion
// queue's role. Every completion (a refused request's error and a READ
// after unsignaled ones among them) reaches exactly one of the two, in
// push order, none of another queue; the sleeper is woken for the
// requests the spinner leaves to it; Close fails it with ErrClosed.
func TestPopBesideWaiter(t *testing.T) {
	onDCPairs(t, func(t *testing.T, a, b *core.Runtime) {
		q, req := reader(t, a, b, "r")
		other, oreq := reader(t, a, b, "o") // traffic of another queue on the same DCIs
		long, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		idle := mustQueue(t, a, b.Node())
		go func() {
			var out [1]krcore.Completion
			idle.PopWait(long, out[:])
		}()
		got := make(chan krcore.Completion, 1)
		ended := make(chan error, 1)
		go func() { // the sleeper
			var out [1]krcore.Completion
			for {
				if _, err := q.PopWait(long, out[:]); err != nil {
					ended <- err
					return
				}
				got <- out[0]
			}
		}()
		const n = 300
		var out [4]krcore.Completion
		bySleeper := 0
		for i := range n {
			r := req
			r.ID = uint64(i)
			switch {
			case i%4 == 1:
				r.Unsignaled = true // retired by the next request's completion, unseen
			case i%4 == 3:
				r.Remote.Off = 64 // past the region's end: refused, an error completion
			}
			if err := q.PushOne(long, true, r); err != nil {
				t.Fatal(err)
			}
			if oreq.ID = uint64(i); other.PushOne(long, true, oreq) != nil || pop1(t, other).ID != uint64(i) {
				t.Fatalf("request %d: the other queue's READ", i)
			}
			if r.Unsignaled {
				continue
			}
			spin := i%3 != 0 // else left to the sleeper
			var c krcore.Completion
			for found := false; !found; {
				if spin && q.Pop(out[:1]) == 1 {
					c, found = out[0], true
					continue
				}
				select {
				case c = <-got:
					found = true
					bySleeper++
				case <-time.After(time.Millisecond):
					if long.Err() != nil {
						t.Fatalf("request %d: no completion (spinning %v): the sleeper was not woken", i, spin)
					}
				}
			}
			if c.ID != uint64(i) || (c.Status == verbs.Success) != (i%4 != 3) {
				t.Fatalf("request %d: completion %+v", i, c)
			}
		}
		if k := q.Pop(out[:]); k != 0 || len(got) != 0 {
			t.Errorf("completions left over: %+v, %d to the sleeper", out[:k], len(got))
		}
		if bySleeper == 0 {
			t.Error("the sleeper got no completion")
		}
		q.Close()
		select {
		case err := <-ended:
			if !errors.Is(err, krcore.ErrClosed) {
				t.Errorf("the sleeper after Close: %v, want ErrClosed", err)
			}
		case <-long.Done():
			t.Error("the sleeper was not woken by Close")
		}
	})
}
