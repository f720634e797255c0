package core

import (
	"testing"

	"github.com/krcore/krcore"
)

// TestBufRing: a port's posted buffers come out in the order they went in
// across the ring's wrap and its growth while wrapped, and a taken slot
// keeps no MR.
func TestBufRing(t *testing.T) {
	var r bufRing
	next, want := 0, 0
	post := func(k int) {
		for range k {
			if r.full() {
				r.grow()
			}
			r.put(krcore.Local{Off: next})
			next++
		}
	}
	take := func(k int) {
		t.Helper()
		for range k {
			if r.n == 0 {
				t.Fatalf("empty with %d..%d posted", want, next)
			}
			if b := r.pop(); b.Off != want {
				t.Fatalf("took %d, want %d", b.Off, want)
			}
			want++
		}
	}
	post(5)
	take(3)
	post(5) // wraps in 8
	take(2)
	post(9) // grows while wrapped
	take(1)
	post(20)
	take(next - want)
	if r.n != 0 {
		t.Fatalf("%d left", r.n)
	}
	for i, b := range r.s {
		if b != (krcore.Local{}) {
			t.Fatalf("slot %d still holds %+v", i, b)
		}
	}
	if len(r.s) > 64 {
		t.Errorf("ring of %d for at most 33 posted", len(r.s))
	}
}
