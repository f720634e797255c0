package lite_test

import (
	"testing"

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
