package liteapp

import (
	"runtime"
	"slices"
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
