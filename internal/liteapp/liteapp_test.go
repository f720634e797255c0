package liteapp

import (
	"context"
	"errors"
	"net"
	"net/rpc"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// arrived is how many wait at the barrier name.
func (b *Barriers) arrived(name string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.waiting[name]; g != nil {
		return g.arrived
	}
	return 0
}

// TestBarriers: no Arrive returns before the N-th arrives, then all do;
// the name serves the next generation again.
func TestBarriers(t *testing.T) {
	b := NewBarriers()
	const n = 4
	for gen := range 2 {
		done := make(chan error, n)
		for range n - 1 {
			go func() { done <- b.Arrive(Arrival{Name: "x", N: n}, nil) }()
		}
		for b.arrived("x") < n-1 {
			runtime.Gosched()
		}
		select {
		case <-done:
			t.Fatalf("generation %d: an Arrive returned with %d of %d arrived", gen, n-1, n)
		default:
		}
		if err := b.Arrive(Arrival{Name: "x", N: n}, nil); err != nil {
			t.Fatal(err)
		}
		for range n - 1 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if a := b.arrived("x"); a != 0 {
			t.Fatalf("generation %d left %d arrivals behind", gen, a)
		}
	}
}

// TestAlternate: each implementation runs every round, the order reversed
// from one round to the next.
func TestAlternate(t *testing.T) {
	var order []string
	all, err := Alternate([]string{"a", "b"}, 3, func(impl string, round int) (int, error) {
		order = append(order, impl)
		return round, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "b", "a", "a", "b"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if !slices.Equal(all["a"], []int{1, 2, 3}) || !slices.Equal(all["b"], []int{1, 2, 3}) {
		t.Fatalf("results %v", all)
	}
}

func TestMedianSlowestImpls(t *testing.T) {
	ds := []time.Duration{3, 1, 2}
	if m := Median(ds, func(d time.Duration) time.Duration { return d }); m != 2 {
		t.Fatalf("Median = %v", m)
	}
	if s := Slowest([]string{"1ms", "3ms", "junk", "2ms"}); s != 3*time.Millisecond {
		t.Fatalf("Slowest = %v", s)
	}
	if Impls("both") == nil || Impls("lite")[0] != "lite" || Impls("tcp") != nil {
		t.Fatal("Impls")
	}
}

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestPeers: a Peers dials a process on its first Call and keeps that
// connection for the next; a Call whose context ends while the reply is
// outstanding returns the context's error.
func TestPeers(t *testing.T) {
	srv := rpc.NewServer()
	if err := srv.Register(NewBarriers()); err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: tcp}
	defer ln.Close()
	go ServeRPC(srv, ln)
	ps := &Peers{Addrs: []string{ln.Addr().String()}}
	defer ps.Close()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ps.Arrive(short, "x", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Arrive alone at a barrier of 2: %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The second of 2 arrivals: it returns once the server took it, over
	// whichever connection it came.
	if err := ps.Arrive(ctx, "x", 2); err != nil {
		t.Fatalf("second Arrive: %v", err)
	}
	if n := ln.n.Load(); n != 1 {
		t.Errorf("the process accepted %d connections for two calls, want 1", n)
	}
}
