package lite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
)

// pattern is n bytes that differ from their neighbours at every shift a
// test uses.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func malloc(t *testing.T, n *lite.Node, name string, size int, allow lite.Perm) *lite.LMR {
	t.Helper()
	l, err := n.Malloc(ctxT(t), name, size, allow)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mapLMR(t *testing.T, n *lite.Node, master krcore.NodeID, name string, perm lite.Perm) lite.Handle {
	t.Helper()
	h, err := n.Map(ctxT(t), master, name, perm)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestMemset: the holder sets the bytes through a Write grant, beyond one
// chunk, and refuses a read-only handle, a range past the end and a freed
// LMR.
func TestMemset(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			l := malloc(t, master, "m", 300<<10, lite.Read|lite.Write)
			copy(l.Bytes(), pattern(300<<10))
			want := pattern(300 << 10)
			h := mapLMR(t, mapper, 2, "m", lite.Read|lite.Write)
			if err := mapper.Memset(ctx, h, 1001, 200<<10, 0xab); err != nil {
				t.Fatal(err)
			}
			copy(want[1001:], bytes.Repeat([]byte{0xab}, 200<<10))
			if !bytes.Equal(l.Bytes(), want) {
				t.Fatal("Memset: the LMR differs from the model")
			}
			ro := mapLMR(t, mapper, 2, "m", lite.Read)
			if err := mapper.Memset(ctx, ro, 0, 10, 1); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Memset through a read-only handle: %v, want ErrPerm", err)
			}
			if err := mapper.Memset(ctx, h, 300<<10-4, 8, 1); !errors.Is(err, krcore.ErrInvalid) {
				t.Fatalf("Memset past the end: %v, want ErrInvalid", err)
			}
			if !bytes.Equal(l.Bytes(), want) {
				t.Fatal("a refused Memset changed the LMR")
			}
			if err := l.Free(); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Memset(ctx, h, 0, 10, 1); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Memset after Free: %v, want ErrFreed", err)
			}
		})
	}
}

// TestMemmove: overlapping moves within one LMR, towards higher and lower
// offsets, each larger than a chunk, match Go's copy.
func TestMemmove(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			const size = 512 << 10
			l := malloc(t, master, "mv", size, lite.Read|lite.Write)
			want := pattern(size)
			copy(l.Bytes(), want)
			h := mapLMR(t, mapper, 2, "mv", lite.Read|lite.Write)
			for _, c := range []struct{ dst, src, n int }{
				{1000, 0, 300 << 10},   // up: dst overlaps src's tail
				{0, 4097, 300 << 10},   // down: dst overlaps src's head
				{70000, 69999, 200000}, // up by one byte
			} {
				if err := mapper.Memmove(ctx, h, c.dst, c.src, c.n); err != nil {
					t.Fatal(err)
				}
				copy(want[c.dst:c.dst+c.n], want[c.src:c.src+c.n])
				if !bytes.Equal(l.Bytes(), want) {
					t.Fatalf("Memmove %+v: the LMR differs from the model", c)
				}
			}
			ro := mapLMR(t, mapper, 2, "mv", lite.Read)
			if err := mapper.Memmove(ctx, ro, 0, 10, 10); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Memmove through a read-only handle: %v, want ErrPerm", err)
			}
			wo := mapLMR(t, mapper, 2, "mv", lite.Write)
			if err := mapper.Memmove(ctx, wo, 0, 10, 10); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Memmove through a write-only handle: %v, want ErrPerm", err)
			}
		})
	}
}

// TestMemcpy: copies between two LMRs held by one node, and across nodes
// (the holder of dst READs src through the caller's grant), both ways
// round between the embedded node and the caller's, checked byte for byte;
// a read-only dst, a src the caller may not read and a freed src are
// refused.
func TestMemcpy(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			far, mapper := open(t, masterAPI), open(t, api)
			const size = 1 << 20
			lmrs := map[string]*lite.LMR{
				"a2": malloc(t, far, "a2", size, lite.Read|lite.Write),
				"b2": malloc(t, far, "b2", size, lite.Read|lite.Write),
				"c1": malloc(t, mapper, "c1", size, lite.Read|lite.Write),
			}
			master := map[string]krcore.NodeID{"a2": 2, "b2": 2, "c1": 1}
			for i, name := range []string{"a2", "b2", "c1"} {
				p := pattern(size)
				p[0] = byte(i)
				copy(lmrs[name].Bytes(), p)
			}
			h := map[string]lite.Handle{}
			for name := range lmrs {
				h[name] = mapLMR(t, mapper, master[name], name, lite.Read|lite.Write)
			}
			for _, c := range []struct {
				dst, src       string
				dstOff, srcOff int
				n              int
			}{
				{"b2", "a2", 5, 3, 700 << 10},   // one holder
				{"a2", "c1", 0, 1, size - 1},    // node 2 READs from node 1
				{"c1", "b2", 100, 0, 600 << 10}, // node 1 READs from node 2
			} {
				want := append([]byte(nil), lmrs[c.dst].Bytes()...)
				copy(want[c.dstOff:], lmrs[c.src].Bytes()[c.srcOff:c.srcOff+c.n])
				if err := mapper.Memcpy(ctx, h[c.dst], c.dstOff, h[c.src], c.srcOff, c.n); err != nil {
					t.Fatalf("Memcpy %+v: %v", c, err)
				}
				if !bytes.Equal(lmrs[c.dst].Bytes(), want) {
					t.Fatalf("Memcpy %+v: dst differs from the model", c)
				}
			}
			// The caller's node READs through the grant it learns for the
			// copy: through krcored the daemon's table of its regions stays
			// as it was.
			held := testcluster.DaemonRegions(t, api)
			for range 5 {
				if err := mapper.Memcpy(ctx, h["c1"], 0, h["b2"], 0, 4096); err != nil {
					t.Fatal(err)
				}
			}
			if n := testcluster.DaemonRegions(t, api); n != held {
				t.Errorf("krcored holds %d regions of the caller after 5 copies, %d before", n, held)
			}
			before := append([]byte(nil), lmrs["a2"].Bytes()...)
			ro := mapLMR(t, mapper, 2, "a2", lite.Read)
			if err := mapper.Memcpy(ctx, ro, 0, h["b2"], 0, 100); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Memcpy to a read-only handle: %v, want ErrPerm", err)
			}
			for _, src := range []string{"b2", "c1"} { // held here, and at another node
				wo := mapLMR(t, mapper, master[src], src, lite.Write)
				if err := mapper.Memcpy(ctx, h["a2"], 0, wo, 0, 100); !errors.Is(err, lite.ErrPerm) {
					t.Fatalf("Memcpy from a write-only handle on %s: %v, want ErrPerm", src, err)
				}
			}
			if !bytes.Equal(lmrs["a2"].Bytes(), before) {
				t.Fatal("a refused Memcpy changed dst")
			}
			if err := lmrs["c1"].Free(); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Memcpy(ctx, h["a2"], 0, h["c1"], 0, 100); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Memcpy from a freed src: %v, want ErrFreed", err)
			}
			if err := lmrs["a2"].Free(); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Memcpy(ctx, h["a2"], 0, h["b2"], 0, 100); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Memcpy to a freed dst: %v, want ErrFreed", err)
			}
		})
	}
}

// BenchmarkMemcpy1MiB: a 1 MiB copy issued from node 1 (embedded, and
// through krcored) between LMRs of other nodes, done at the holder of dst
// (src at the same node, or READ from a third) against the same bytes
// READ and WRITTEN through the caller, all in one run.
func BenchmarkMemcpy1MiB(b *testing.B) {
	others, callers := testcluster.APIs(b, 3)
	ctx := context.Background()
	var masters [4]*lite.Node
	for i, api := range others {
		n, err := lite.Open(ctx, api, lite.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer n.Close()
		masters[i+2] = n
	}
	const size = 1 << 20
	where := map[string]krcore.NodeID{"dst": 2, "near": 2, "far": 3}
	for name, master := range where {
		if _, err := masters[master].Malloc(ctx, name, size, lite.Read|lite.Write); err != nil {
			b.Fatal(err)
		}
	}
	for _, runtime := range []string{"embedded", "daemon"} {
		caller, err := lite.Open(ctx, callers[runtime], lite.Options{})
		if err != nil {
			b.Fatal(err)
		}
		h := map[string]lite.Handle{}
		for name, master := range where {
			if h[name], err = caller.Map(ctx, master, name, lite.Read|lite.Write); err != nil {
				b.Fatal(err)
			}
		}
		for _, src := range []string{"near", "far"} {
			b.Run(runtime+"/holder/src-"+src, func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					if err := caller.Memcpy(ctx, h["dst"], 0, h[src], 0, size); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(runtime+"/caller/src-"+src, func(b *testing.B) {
				buf := make([]byte, size)
				b.SetBytes(size)
				for b.Loop() {
					if err := caller.Read(ctx, h[src], 0, buf); err != nil {
						b.Fatal(err)
					}
					if err := caller.Write(ctx, h["dst"], 0, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		caller.Close()
	}
}

// TestMemopsStriped: Memset, Memmove (overlapping, both directions) and
// Memcpy on an LMR striped over three nodes, ranges crossing stripes, each
// piece done by the node holding its dst bytes, checked against a model.
func TestMemopsStriped(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			mapper, master := open(t, api), open(t, others[0])
			open(t, others[1]) // node 3, a holder
			const size = 3<<16 + 1000
			striped, err := master.MallocOn(ctx, "s", size, lite.Read|lite.Write,
				lite.Placement{Nodes: []krcore.NodeID{3, 2, 1}, Stripe: 4096})
			if err != nil {
				t.Fatal(err)
			}
			flat := malloc(t, master, "flat", size, lite.Read|lite.Write)
			s := mapLMR(t, mapper, 2, "s", lite.Read|lite.Write)
			f := mapLMR(t, mapper, 2, "flat", lite.Read|lite.Write)
			want := pattern(size)
			if err := mapper.Write(ctx, s, 0, want); err != nil {
				t.Fatal(err)
			}
			wantFlat := pattern(size)
			wantFlat[0] = 99
			copy(flat.Bytes(), wantFlat)
			check := func(what string) {
				t.Helper()
				got := make([]byte, size)
				if err := mapper.Read(ctx, s, 0, got); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s: %v, striped LMR equal to the model %v", what, err, bytes.Equal(got, want))
				}
				if !bytes.Equal(flat.Bytes(), wantFlat) {
					t.Fatalf("%s: flat LMR differs from the model", what)
				}
			}
			if err := mapper.Memset(ctx, s, 4000, 3*4096, 0xee); err != nil {
				t.Fatal(err)
			}
			copy(want[4000:], bytes.Repeat([]byte{0xee}, 3*4096))
			check("Memset across stripes")
			for _, c := range []struct{ dst, src, n int }{{5000, 100, 50000}, {100, 5000, 50000}, {4097, 4095, 9000}} {
				if err := mapper.Memmove(ctx, s, c.dst, c.src, c.n); err != nil {
					t.Fatal(err)
				}
				copy(want[c.dst:c.dst+c.n], want[c.src:c.src+c.n])
				check(fmt.Sprintf("Memmove %+v", c))
			}
			if err := mapper.Memcpy(ctx, s, 1234, f, 777, 100000); err != nil {
				t.Fatal(err)
			}
			copy(want[1234:], wantFlat[777:777+100000])
			check("Memcpy flat to striped")
			if err := mapper.Memcpy(ctx, f, 10, s, 3, 150000); err != nil {
				t.Fatal(err)
			}
			copy(wantFlat[10:], want[3:3+150000])
			check("Memcpy striped to flat")
			ro := mapLMR(t, mapper, 2, "s", lite.Read)
			if err := mapper.Memset(ctx, ro, 4*4096, 10, 1); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Memset on a stripe through a read handle: %v, want ErrPerm", err)
			}
			if err := striped.Free(); err != nil { // while its holders are open
				t.Fatal(err)
			}
		})
	}
}
