package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/verbs"
)

// vqWaiters are a VQ's blocking calls, run with a long context: a Close
// must end them long before it ends.
var vqWaiters = map[string]func(ctx context.Context, q krcore.VQ) error{
	"PopWait": func(ctx context.Context, q krcore.VQ) error {
		var out [1]krcore.Completion
		_, err := q.PopWait(ctx, out[:])
		return err
	},
	"PopMsgsWait": func(ctx context.Context, q krcore.VQ) error {
		var out [1]krcore.Message
		_, err := q.PopMsgsWait(ctx, out[:])
		return err
	},
}

// startVQWaiters starts two of each waiter on q (one sleeps on the bell,
// one waits for its turn) and returns their results by name.
func startVQWaiters(ctx context.Context, q krcore.VQ, prefix string) map[string]chan error {
	res := map[string]chan error{}
	for name, w := range vqWaiters {
		for i := range 2 {
			ch := make(chan error, 1)
			res[fmt.Sprintf("%s%s#%d", prefix, name, i)] = ch
			go func() { ch <- w(ctx, q) }()
		}
	}
	return res
}

// TestVQCloseWakesWaiters: closing a daemon VQ wakes its waiters with
// ErrClosed; waits on the closed VQ return at once, after what had already
// arrived is popped.
func TestVQCloseWakesWaiters(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	q, g := connect(t, ctx, c)
	if err := q.Bind(9); err != nil {
		t.Fatal(err)
	}
	long, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := startVQWaiters(long, q, "")
	time.Sleep(20 * time.Millisecond) // let them fall asleep; awake they must fail the same
	if err := bounded.Within(t, time.Second, "Close", q.Close); err != nil {
		t.Fatal(err)
	}
	bounded.AllFail(t, time.Second, res, krcore.ErrClosed)
	for name, w := range vqWaiters {
		if err := bounded.Within(t, time.Second, name+" on a closed VQ", func() error { return w(long, q) }); !errors.Is(err, krcore.ErrClosed) {
			t.Errorf("%s on a closed VQ: %v, want ErrClosed", name, err)
		}
	}

	// A completion that arrived before Close is still popped after it.
	q2, _ := connect(t, ctx, c)
	buf, _ := c.RegMR(64, verbs.AccessAll)
	if _, err := q2.Push(ctx, true, krcore.Request{ID: 7, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the READ's completion on the ring", func() bool { return client.DebugCompleted(q2) > 0 })
	q2.Close()
	var out [1]krcore.Completion
	if n, err := q2.PopWait(long, out[:]); n != 1 || err != nil || out[0].ID != 7 || out[0].Status != verbs.Success {
		t.Errorf("PopWait on a closed VQ holding a completion: %d %v %+v, want it", n, err, out[0])
	}
	if n, err := q2.PopWait(long, out[:]); n != 0 || !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("PopWait on a closed, drained VQ: %d %v, want ErrClosed", n, err)
	}
}

// TestClientCloseWakesWaiters: closing the client wakes every VQ's
// waiters with ErrClosed, and later calls fail with it.
func TestClientCloseWakesWaiters(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	long, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all := map[string]chan error{}
	var qs []krcore.VQ
	for i := range 2 {
		q, _ := connect(t, ctx, c)
		if err := q.Bind(uint32(10 + i)); err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
		for k, ch := range startVQWaiters(long, q, fmt.Sprintf("vq%d/", i)) {
			all[k] = ch
		}
	}
	time.Sleep(20 * time.Millisecond)
	if err := bounded.Within(t, time.Second, "Client.Close", c.Close); err != nil {
		t.Fatal(err)
	}
	bounded.AllFail(t, time.Second, all, krcore.ErrClosed)
	if _, err := c.Queue(); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Queue after Close: %v, want ErrClosed", err)
	}
	if _, err := qs[0].Push(ctx, false, krcore.Request{Op: verbs.OpRead}); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Push after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

// TestCloseRetiresMRMemory: a slice of RegMR's memory still held when the
// client closes (an smc connection's buffer) does not fault the process.
func TestCloseRetiresMRMemory(t *testing.T) {
	e := startEnv(t)
	c := attach(t, e)
	m, err := c.RegMR(3*4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	held := m.Bytes()
	held[0] = 7
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if held[0] != 0 {
		t.Errorf("held slice after Close: %d, want the zero of released memory", held[0])
	}
	held[len(held)-1] = 1 // would be SIGSEGV had Close unmapped it
}

// TestCloseFlushesInFlight: requests in flight when the VQ or the client
// closes complete, with WR_FLUSH_ERR unless they had finished, as on the
// embedded runtime, whether the peer answers or is silent (its device
// closed: nothing can have finished): a caller that spins on Pop until
// it has them all ends, Outstanding falls to 0, and PopWait then fails
// with ErrClosed.
func TestCloseFlushesInFlight(t *testing.T) {
	for _, which := range []string{"VQ", "Client", "VQ/silent", "Client/silent"} {
		t.Run(which, func(t *testing.T) {
			e := startEnv(t)
			ctx := ctxT(t)
			c := attach(t, e)
			q, g := connect(t, ctx, c)
			buf, err := c.RegMR(64, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			silent := strings.HasSuffix(which, "/silent")
			if silent {
				e.c.Devices[1].Close()
			}
			reqs := make([]krcore.Request, 8)
			for i := range reqs {
				reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0), Unsignaled: i%2 == 0}
			}
			n, err := q.Push(ctx, false, reqs...)
			if n == 0 {
				t.Fatalf("pushed none: %v", err)
			}
			closer := q.Close
			if strings.HasPrefix(which, "Client") {
				closer = c.Close
			}
			if err := bounded.Within(t, 5*time.Second, which+".Close", closer); err != nil {
				t.Fatal(err)
			}
			statuses := map[verbs.Status]int{}
			err = bounded.Within(t, 5*time.Second, "Pop after Close", func() error {
				var out [4]krcore.Completion
				for q.Outstanding() > 0 {
					k := q.Pop(out[:])
					for _, c := range out[:k] {
						statuses[c.Status]++
					}
					time.Sleep(time.Millisecond)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%v; popped %v of %d", err, statuses, n)
			}
			t.Logf("%d requests in flight at Close: %v", n, statuses)
			for st := range statuses {
				if st != verbs.Success && st != verbs.WRFlushErr {
					t.Errorf("status %v after Close, want SUCCESS or WR_FLUSH_ERR", st)
				}
			}
			if silent && statuses[verbs.WRFlushErr] != n {
				t.Errorf("silent peer: %v, want %d WR_FLUSH_ERR", statuses, n)
			}
			var out [1]krcore.Completion
			if k, err := q.PopWait(ctx, out[:]); k != 0 || !errors.Is(err, krcore.ErrClosed) {
				t.Errorf("PopWait after Close: %d %v, want ErrClosed", k, err)
			}
		})
	}
}
