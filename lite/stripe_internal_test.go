package lite

import (
	"reflect"
	"testing"
)

// TestExtents: an operation is cut at stripe boundaries and at the
// largest request, and each extent names the node holding it and the
// offset in that node's piece (stripes dealt round-robin).
func TestExtents(t *testing.T) {
	l := layout{size: 100, stripe: 16, nodes: []uint64{7, 8, 9}}
	got := l.extents(10, 40, 12)
	want := []extent{
		{node: 0, remote: 10, at: 0, n: 6},  // stripe 0 on node 7
		{node: 1, remote: 0, at: 6, n: 12},  // stripe 1 on node 8, cut at 12
		{node: 1, remote: 12, at: 18, n: 4}, // its rest
		{node: 2, remote: 0, at: 22, n: 12}, // stripe 2 on node 9
		{node: 2, remote: 12, at: 34, n: 4},
		{node: 0, remote: 16, at: 38, n: 2}, // stripe 3: node 7's second
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("extents:\n got %+v\nwant %+v", got, want)
	}
	one := single(7, 100)
	if got := one.extents(0, 100, 64); !reflect.DeepEqual(got, []extent{{0, 0, 0, 64}, {0, 64, 64, 36}}) {
		t.Fatalf("single-node extents: %+v", got)
	}
	for _, c := range [][2]int{{-1, 1}, {0, 101}, {100, 1}, {1, -1}} {
		if l.fits(c[0], c[1]) == nil {
			t.Fatalf("%d bytes at %d fit a 100-byte LMR", c[1], c[0])
		}
	}
}
