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
