package smc

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestCreditOutOfOrder: a completion that comes before an earlier
// request's frees its own connection's bytes and leaves the earlier
// request owed, so that its completion still frees what it holds; a
// failed one aborts its connection; an unknown one changes nothing.
func TestCreditOutOfOrder(t *testing.T) {
	a, b := &Conn{}, &Conn{}
	s := &sharedQueue{owed: []owed{{id: 1, c: a, n: 10}, {id: 2, c: a, n: 20}, {id: 3, c: b, cdc: true}}}
	s.outs[0] = krcore.Completion{ID: 2}
	s.outs[1] = krcore.Completion{ID: 99}
	s.credit(2)
	if a.freed != 20 || len(s.owed) != 2 || s.owed[0].id != 1 {
		t.Fatalf("after request 2 completed: freed %d, owed %v; want 20 freed, requests 1 and 3 owed", a.freed, s.owed)
	}
	s.outs[0] = krcore.Completion{ID: 3, Status: verbs.RemAccessErr}
	s.outs[1] = krcore.Completion{ID: 1}
	s.credit(2)
	if a.freed != 30 || b.cdcDone != 1 || len(s.owed) != 0 {
		t.Fatalf("after requests 3 and 1: a freed %d, b's CDC slots done %d, owed %v; want 30, 1, none", a.freed, b.cdcDone, s.owed)
	}
	if a.err != nil || !errors.Is(b.err, syscall.ECONNRESET) {
		t.Fatalf("errors: a %v (want nil), b %v (want ECONNRESET)", a.err, b.err)
	}
}

// refusingVQ is a queue whose every push fails.
type refusingVQ struct {
	krcore.VQ
	err error
}

func (q refusingVQ) PushOne(context.Context, bool, krcore.Request) error { return q.err }

// TestPushRefused: a request the queue refuses frees its staging bytes
// and comes back as the push's error, for the caller to abort with; the
// refusal is not also recorded on the connection as a failed completion.
func TestPushRefused(t *testing.T) {
	c := &Conn{}
	s := &sharedQueue{q: refusingVQ{err: krcore.ErrClosed}}
	err := s.push(krcore.Request{Op: verbs.OpWriteImm}, owed{c: c, n: 8})
	if !errors.Is(err, krcore.ErrClosed) {
		t.Fatalf("push: %v, want ErrClosed", err)
	}
	if c.freed != 8 || c.err != nil || len(s.owed) != 0 {
		t.Fatalf("after the refusal: freed %d, connection error %v, owed %v; want 8, nil, none", c.freed, c.err, s.owed)
	}
}

// heldVQ accepts every push and completes a request only when the test
// says so; its PopWait sees completions only when rung, so that a test
// can tell whether someone else's Pop woke the waiter.
type heldVQ struct {
	krcore.VQ
	mu   sync.Mutex
	done []krcore.Completion
	bell chan struct{}
}

func (q *heldVQ) PushOne(context.Context, bool, krcore.Request) error { return nil }

func (q *heldVQ) Pop(out []krcore.Completion) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := copy(out, q.done)
	q.done = q.done[k:]
	return k
}

func (q *heldVQ) PopWait(ctx context.Context, out []krcore.Completion) (int, error) {
	select {
	case <-q.bell:
		return q.Pop(out), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (q *heldVQ) complete(id uint64) {
	q.mu.Lock()
	q.done = append(q.done, krcore.Completion{ID: id})
	q.mu.Unlock()
}

// TestWaitHoldsNoPush: a connection waiting for its request's completion
// does not hold up another connection's push on the same queue, and a
// completion that push pops on its way ends the wait at once.
func TestWaitHoldsNoPush(t *testing.T) {
	n := &Node{reapKick: make(chan struct{}, 1)}
	a, b := &Conn{node: n}, &Conn{node: n}
	q := &heldVQ{bell: make(chan struct{})}
	s := &sharedQueue{q: q}
	if err := s.push(krcore.Request{}, owed{c: a, n: 8}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- s.settle(context.Background(), a, func() bool { return a.freed == 8 }) }()
	for popping := false; !popping; {
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		popping = s.popping
		s.mu.Unlock()
	}
	q.complete(1) // PopWait is not rung: only the next push's Pop sees it
	pushed := make(chan error, 1)
	go func() { pushed <- s.push(krcore.Request{}, owed{c: b, n: 4}) }()
	for name, ch := range map[string]chan error{"push beside the wait": pushed, "wait, once the push popped its completion": waited} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still blocked after 5s", name)
		}
	}
	if a.freed != 8 || len(s.owed) != 1 || s.owed[0].c != b {
		t.Fatalf("a freed %d, owed %v; want 8 and b's request alone", a.freed, s.owed)
	}
}

// TestSettleWriteEnds: a Write waiting for staging room (its earlier
// WRITEs' completions) ends at the write deadline with
// os.ErrDeadlineExceeded and at Close with net.ErrClosed, within a
// bound, and leaves the connection unaborted: nothing was staged.
func TestSettleWriteEnds(t *testing.T) {
	for _, end := range []string{"deadline", "close"} {
		n := &Node{reapKick: make(chan struct{}, 1)}
		c := newConn(nil, &Options{Node: n}, false)
		c.q = &sharedQueue{q: &heldVQ{bell: make(chan struct{})}}
		if err := c.q.push(krcore.Request{}, owed{c: c, n: 8}); err != nil {
			t.Fatal(err)
		}
		c.sent = 8
		waited := make(chan error, 1)
		go func() { waited <- c.settleWrite(func() bool { return c.sent == c.freed }) }()
		time.Sleep(10 * time.Millisecond) // let it block (it ends either way)
		want := os.ErrDeadlineExceeded
		if end == "deadline" {
			c.SetWriteDeadline(time.Now().Add(-time.Second))
		} else {
			close(c.done)
			want = net.ErrClosed
		}
		select {
		case err := <-waited:
			if err != want {
				t.Errorf("%s: settleWrite = %v, want %v", end, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: settleWrite still blocked after 5s", end)
		}
		if c.err != nil {
			t.Errorf("%s: the connection was aborted: %v", end, c.err)
		}
	}
}
