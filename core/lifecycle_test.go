package core_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/verbs"
)

// waiters are the blocking calls of a queue, each run in its own goroutine
// with a long context: a Close must end them well before it ends.
var waiters = map[string]func(ctx context.Context, q *core.Queue) error{
	"PopWait": func(ctx context.Context, q *core.Queue) error {
		var out [1]krcore.Completion
		_, err := q.PopWait(ctx, out[:])
		return err
	},
	"PopMsgsWait": func(ctx context.Context, q *core.Queue) error {
		var out [1]krcore.Message
		_, err := q.PopMsgsWait(ctx, out[:])
		return err
	},
}

// startWaiters starts every waiter on q (several of each, so some sleep on
// the completion queue and some beside it) and returns their results.
func startWaiters(ctx context.Context, q *core.Queue) map[string]chan error {
	res := make(map[string]chan error)
	for name, w := range waiters {
		for i := range 3 {
			ch := make(chan error, 1)
			res[fmt.Sprintf("%s#%d", name, i)] = ch
			go func() { ch <- w(ctx, q) }()
		}
	}
	return res
}

// settle gives the waiters started just before time to go to sleep, so the
// Close that follows finds them asleep (if it does not, the test is merely
// weaker: a waiter that has not slept yet must fail the same way).
func settle() { time.Sleep(20 * time.Millisecond) }

// TestQueueCloseWakesWaiters: closing a queue wakes every goroutine waiting
// on it, wherever it sleeps, and fails it with ErrClosed; a wait on a
// closed queue with nothing left returns at once, while completions
// already there are still popped first.
func TestQueueCloseWakesWaiters(t *testing.T) {
	onDCPairs(t, func(t *testing.T, a, b *core.Runtime) {
		q, _ := reader(t, a, b, "r")
		if err := q.Bind(9); err != nil {
			t.Fatal(err)
		}
		long, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res := startWaiters(long, q)
		settle()
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		bounded.AllFail(t, time.Second, res, krcore.ErrClosed)
		for name, w := range waiters {
			err := bounded.Within(t, time.Second, name+" on a closed queue", func() error { return w(long, q) })
			if !errors.Is(err, krcore.ErrClosed) {
				t.Errorf("%s on a closed queue: %v, want ErrClosed", name, err)
			}
		}

		// A completion that finished before Close is still popped.
		q2, req2 := reader(t, a, b, "r2")
		if _, err := q2.Push(long, true, req2); err != nil {
			t.Fatal(err)
		}
		for core.DebugDone(q2) == 0 { // dispatch without popping
			q2.Pop(nil)
			runtime.Gosched()
		}
		q2.Close()
		var out [1]krcore.Completion
		n, err := q2.PopWait(long, out[:])
		if n != 1 || err != nil || out[0].Status != verbs.Success {
			t.Errorf("PopWait on a closed queue holding a completion: %d %v %+v, want it popped", n, err, out[0])
		}
		if n, err := q2.PopWait(long, out[:]); n != 0 || !errors.Is(err, krcore.ErrClosed) {
			t.Errorf("PopWait on a closed, drained queue: %d %v, want ErrClosed", n, err)
		}
	})
}

// reader is a queue from a to b connected for 8-byte READs of a region b
// exports as name, and such a READ.
func reader(t *testing.T, a, b *core.Runtime, name string) (*core.Queue, krcore.Request) {
	t.Helper()
	serve(t, b, name, 64)
	g, err := a.Region(ctx(t), b.Node(), name)
	if err != nil {
		t.Fatal(err)
	}
	local, err := a.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	return mustQueue(t, a, b.Node()), krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}
}

// TestRuntimeCloseWakesWaiters: closing the runtime fails every waiter of
// every queue, and a group's waiter, with ErrClosed, wherever it sleeps.
func TestRuntimeCloseWakesWaiters(t *testing.T) {
	onDCPairs(t, func(t *testing.T, a, b *core.Runtime) {
		long, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		all := map[string]chan error{}
		for i := range 2 {
			q, _ := reader(t, a, b, fmt.Sprint("r", i))
			if err := q.Bind(uint32(10 + i)); err != nil {
				t.Fatal(err)
			}
			for name, ch := range startWaiters(long, q) {
				all[fmt.Sprintf("queue%d/%s", i, name)] = ch
			}
		}
		g := a.Group()
		gch := make(chan error, 1)
		all["Group.Wait"] = gch
		go func() { gch <- g.Wait(long, func() bool { return false }, nil) }()
		settle()
		if err := bounded.Within(t, 5*time.Second, "Runtime.Close", a.Close); err != nil {
			t.Fatal(err)
		}
		bounded.AllFail(t, time.Second, all, krcore.ErrClosed)
	})
}

// onDCPairs runs f as subtests "mem" and "tcp", each on a dcPair on that
// wire.
func onDCPairs(t *testing.T, f func(t *testing.T, a, b *core.Runtime)) {
	for _, tr := range []struct {
		name string
		tcp  bool
	}{{"mem", false}, {"tcp", true}} {
		t.Run(tr.name, func(t *testing.T) {
			a, b := dcPair(t, tr.tcp)
			f(t, a, b)
		})
	}
}

// dcPair is two DC-only runtimes, on the TCP wire or the in-memory one.
func dcPair(t *testing.T, tcp bool) (a, b *core.Runtime) {
	t.Helper()
	if tcp {
		_, rts := tcpRuntimes(t, 2, core.Config{RCPeers: -1})
		return rts[0], rts[1]
	}
	c := start(t, 2, core.Config{RCPeers: -1})
	return c.Node(1), c.Node(2)
}

// TestCloseRetiresMRMemory: a slice of RegMR's memory that a layer above
// still holds when the runtime closes under it does not fault the process:
// it reads zeros and takes writes; Deregister afterwards says ErrClosed.
func TestCloseRetiresMRMemory(t *testing.T) {
	a, _ := dcPair(t, false)
	m, err := a.RegMR(3*4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	held := m.Bytes()
	held[0], held[len(held)-1] = 7, 7
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if held[0] != 0 || held[len(held)-1] != 0 {
		t.Errorf("held slice after Close: %d %d, want the zeros of released memory", held[0], held[len(held)-1])
	}
	held[1] = 1 // would be SIGSEGV had Close unmapped it
	if m.Bytes() != nil {
		t.Error("MR.Bytes after Close is not nil")
	}
	if err := a.Deregister(m); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Deregister after Close: %v, want ErrClosed", err)
	}
}

// TestRuntimeCloseFlushesInFlight: requests in flight when the runtime
// closes complete, with WR_FLUSH_ERR unless they had finished, in every
// mode and with the peer alive or silent (its device closed: the requests
// are retrying or in recovery at Close): a caller that spins on Pop
// until it has them all ends, Outstanding falls to 0, and PopWait then
// fails with ErrClosed.
func TestRuntimeCloseFlushesInFlight(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		for _, silent := range []bool{false, true} {
			t.Run(fmt.Sprint("silent=", silent), func(t *testing.T) {
				c := m.start(t, 2, core.Config{Path: patientPath})
				a, b := c.Node(1), c.Node(2)
				q, req := reader(t, a, b, "r")
				if silent {
					c.Devices[1].Close()
				}
				closeWithInFlight(t, a, q, req)
			})
		}
	}, modeDC, modeNoDC, modeForced)
}

// closeWithInFlight pushes READs like req on q, closes a under them and
// checks that Pop returns every one, in order, and that q then has
// nothing outstanding and fails PopWait with ErrClosed.
func closeWithInFlight(t *testing.T, a *core.Runtime, q *core.Queue, req krcore.Request) {
	t.Helper()
	reqs := make([]krcore.Request, 8)
	for i := range reqs {
		reqs[i] = req
		reqs[i].ID = uint64(i)
	}
	n, err := q.Push(ctx(t), false, reqs...)
	if n == 0 {
		t.Fatalf("pushed none: %v", err)
	}
	if err := bounded.Within(t, 5*time.Second, "Runtime.Close", a.Close); err != nil {
		t.Fatal(err)
	}
	statuses := map[verbs.Status]int{}
	err = bounded.Within(t, 5*time.Second, "Pop after Close", func() error {
		var out [4]krcore.Completion
		for got := 0; got < n; {
			k := q.Pop(out[:])
			for _, c := range out[:k] {
				if c.ID != uint64(got) {
					return fmt.Errorf("completion %d has ID %d, want push order", got, c.ID)
				}
				statuses[c.Status]++
				got++
			}
			runtime.Gosched()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests in flight at Close: %v", n, statuses)
	for st := range statuses {
		if st != verbs.Success && st != verbs.WRFlushErr {
			t.Errorf("status %v after Close, want SUCCESS or WR_FLUSH_ERR", st)
		}
	}
	if k := q.Outstanding(); k != 0 {
		t.Errorf("%d outstanding after every completion was popped", k)
	}
	var out [1]krcore.Completion
	if k, err := q.PopWait(ctx(t), out[:]); k != 0 || !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("PopWait after Close: %d %v, want ErrClosed", k, err)
	}
}
