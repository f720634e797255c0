package lite_test

import (
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
)

// TestUnmapForgets: through krcored, a mapping's regions leave the
// daemon's table of the mapper's regions when it unmaps (each Map and
// Unmap left one there until the mapper detached).
func TestUnmapForgets(t *testing.T) {
	masterAPI, mappers := apis(t)
	api := mappers["daemon"]
	ctx := ctxT(t)
	far, mapper := open(t, masterAPI), open(t, api)
	malloc(t, far, "m", 4096, lite.Read|lite.Write)
	h := mapLMR(t, mapper, 2, "m", lite.Read) // the first: the Node's own lookups done
	if err := mapper.Unmap(ctx, h); err != nil {
		t.Fatal(err)
	}
	held := testcluster.DaemonRegions(t, api)
	for range 5 {
		h := mapLMR(t, mapper, 2, "m", lite.Read)
		buf := make([]byte, 8)
		if err := mapper.Read(ctx, h, 0, buf); err != nil {
			t.Fatal(err)
		}
		if err := mapper.Unmap(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if n := testcluster.DaemonRegions(t, api); n != held {
		t.Errorf("krcored holds %d regions of the mapper after 5 maps unmapped, %d before", n, held)
	}
}

// TestRPCForgets: through krcored, a caller's Node that closes leaves none
// of the regions its RPC sessions learned (the callee's ring) in the
// daemon, and a callee's Node none of its callers' reply areas.
func TestRPCForgets(t *testing.T) {
	otherAPI, apis := apis(t)
	api := apis["daemon"]
	ctx := ctxT(t)
	held := testcluster.DaemonRegions(t, api)
	for _, side := range []string{"caller", "callee"} {
		server, caller := open(t, otherAPI), open(t, api)
		callee, to := server, krcore.NodeID(2)
		if side == "callee" {
			caller, callee, to = server, caller, 1
		}
		echo(t, callee, 7)
		resp := make([]byte, 16)
		if _, err := caller.Call(ctx, to, 7, []byte("ping"), resp); err != nil {
			t.Fatal(err)
		}
		caller.Close()
		callee.Close()
		if n := testcluster.DaemonRegions(t, api); n != held {
			t.Errorf("%s through krcored: it holds %d regions of the client after the Node closed, %d before", side, n, held)
		}
	}
}

// TestMovedMappingForgets: through krcored, the regions of a mapping its
// LMR moved away from (remapped on the next Read) leave the daemon with
// the handle's Unmap, and those of a handle still mapped with the Node's
// Close.
func TestMovedMappingForgets(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	api := mappers["daemon"]
	ctx := ctxT(t)
	master, mapper := open(t, others[0]), open(t, api)
	open(t, others[1]) // node 3, where the LMR moves
	l, err := master.Malloc(ctx, "moving", 4096, lite.Read|lite.Write)
	if err != nil {
		t.Fatal(err)
	}
	held := testcluster.DaemonRegions(t, api)
	buf := make([]byte, 8)
	var hs []lite.Handle
	for range 2 {
		h := mapLMR(t, mapper, 2, "moving", lite.Read)
		if err := mapper.Read(ctx, h, 0, buf); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for _, to := range []krcore.NodeID{3, 2} {
		if err := l.Move(ctx, to); err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if err := mapper.Read(ctx, h, 0, buf); err != nil { // remapped
				t.Fatal(err)
			}
		}
	}
	if err := mapper.Unmap(ctx, hs[0]); err != nil {
		t.Fatal(err)
	}
	mapper.Close()
	if n := testcluster.DaemonRegions(t, api); n != held {
		t.Errorf("krcored holds %d regions of the mapper after its handles were moved twice, unmapped and closed, %d before", n, held)
	}
}
