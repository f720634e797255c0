package lite_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
)

// TestDirectory: LMRs mastered on nodes 2 and 3, listed at node 2's
// directory, are found by name from node 1 (embedded and through
// krcored); a name is one master's; a freed name disappears.
func TestDirectory(t *testing.T) {
	others, finders := testcluster.APIs(t, 3)
	for name, api := range finders {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			var nodes [4]*lite.Node
			for i, a := range append([]krcore.API{api}, others...) {
				n, err := lite.Open(ctx, a, lite.Options{Directory: 2})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { n.Close() })
				nodes[i+1] = n
			}
			l2 := malloc(t, nodes[2], "on2", 64, lite.Read)
			l3 := malloc(t, nodes[3], "on3", 64, lite.Read)
			copy(l2.Bytes(), "mastered by node 2")
			copy(l3.Bytes(), "mastered by node 3")
			for lmr, want := range map[string]krcore.NodeID{"on2": 2, "on3": 3} {
				if got, err := nodes[1].Master(ctx, lmr); err != nil || got != want {
					t.Fatalf("Master(%q) = %d, %v; want %d", lmr, got, err, want)
				}
				h, err := nodes[1].MapName(ctx, lmr, lite.Read)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 18)
				if err := nodes[1].Read(ctx, h, 0, buf); err != nil || !bytes.HasSuffix(buf, []byte{byte('0' + want)}) {
					t.Fatalf("Read through MapName(%q): %q, %v", lmr, buf, err)
				}
			}
			if _, err := nodes[3].Malloc(ctx, "on2", 64, lite.Read); !errors.Is(err, krcore.ErrBusy) {
				t.Fatalf("Malloc of a name node 2 lists, at node 3: %v, want ErrBusy", err)
			}
			if err := l3.Free(); err != nil {
				t.Fatal(err)
			}
			if _, err := nodes[1].MapName(ctx, "on3", lite.Read); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("MapName of a freed LMR: %v, want ErrFreed", err)
			}
			if _, err := nodes[1].Master(ctx, "on3"); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Master of a freed LMR: %v, want ErrFreed", err)
			}
			malloc(t, nodes[1], "on3", 64, lite.Read) // the name is free again
			if got, err := nodes[3].Master(ctx, "on3"); err != nil || got != 1 {
				t.Fatalf("Master(on3) after node 1 took it: %d, %v", got, err)
			}
		})
	}
}
