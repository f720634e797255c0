package lite_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// TestShare: a mapping with Share passes at most its rights to another
// node, which then Maps with them beyond what the LMR allows everyone;
// without Share, or beyond its rights, the master refuses (ErrPerm).
func TestShare(t *testing.T) {
	others, sharers := testcluster.APIs(t, 3)
	for name, api := range sharers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			sharer, master, third := open(t, api), open(t, others[0]), open(t, others[1])
			l := malloc(t, master, "s", 64, 0) // nobody may map it by default
			if _, err := third.Map(ctx, 2, "s", lite.Read); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Map of an LMR allowing nothing: %v, want ErrPerm", err)
			}
			if err := l.SetPerm(1, lite.Read|lite.Write|lite.Share); err != nil {
				t.Fatal(err)
			}
			h := mapLMR(t, sharer, 2, "s", lite.Read|lite.Share)
			plain := mapLMR(t, sharer, 2, "s", lite.Read)
			if err := sharer.Share(ctx, plain, 3, lite.Read); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Share through a mapping without Share: %v, want ErrPerm", err)
			}
			if err := sharer.Share(ctx, h, 3, lite.Read|lite.Write); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Share of Write through a read mapping: %v, want ErrPerm", err)
			}
			if _, err := third.Map(ctx, 2, "s", lite.Read); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Map after refused Shares: %v, want ErrPerm", err)
			}
			if err := sharer.Share(ctx, h, 3, lite.Read); err != nil {
				t.Fatal(err)
			}
			copy(l.Bytes(), "shared")
			th := mapLMR(t, third, 2, "s", lite.Read)
			buf := make([]byte, 6)
			if err := third.Read(ctx, th, 0, buf); err != nil || string(buf) != "shared" {
				t.Fatalf("Read through a shared mapping: %q, %v", buf, err)
			}
			if _, err := third.Map(ctx, 2, "s", lite.Read|lite.Write); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Map with more than was shared: %v, want ErrPerm", err)
			}
			if err := third.Share(ctx, th, 1, lite.Read); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("re-Share without Share: %v, want ErrPerm", err)
			}
		})
	}
}

// TestAdmin: a mapping with Admin changes who may map the LMR how at the
// master (grants beyond the new rights are withdrawn) and frees it; a
// mapping without Admin is refused both (ErrPerm).
func TestAdmin(t *testing.T) {
	others, admins := testcluster.APIs(t, 3)
	for name, api := range admins {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			admin, master, third := open(t, api), open(t, others[0]), open(t, others[1])
			l := malloc(t, master, "a", 64, lite.Read|lite.Write)
			if err := l.SetPerm(1, lite.Admin|lite.Read); err != nil {
				t.Fatal(err)
			}
			h := mapLMR(t, admin, 2, "a", lite.Admin)
			th := mapLMR(t, third, 2, "a", lite.Read|lite.Write)
			if err := third.SetPerm(ctx, th, 0, lite.Read|lite.Write|lite.Admin); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("SetPerm without Admin: %v, want ErrPerm", err)
			}
			if err := third.Free(ctx, th); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Free without Admin: %v, want ErrPerm", err)
			}
			if _, err := admin.Map(ctx, 2, "a", lite.Write); err != nil {
				t.Fatalf("Map with Write the LMR allows: %v", err)
			}
			if err := admin.SetPerm(ctx, h, 0, lite.Read); err != nil { // everyone: Read only
				t.Fatal(err)
			}
			if err := third.Write(ctx, th, 0, []byte("x")); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("Write through a grant beyond the new rights: %v, want REM_ACCESS_ERR", err)
			}
			if _, err := third.Map(ctx, 2, "a", lite.Write); !errors.Is(err, lite.ErrPerm) {
				t.Fatalf("Map with Write after SetPerm Read: %v, want ErrPerm", err)
			}
			rh := mapLMR(t, third, 2, "a", lite.Read)
			if err := admin.Free(ctx, h); err != nil {
				t.Fatal(err)
			}
			if l.Bytes() != nil {
				t.Fatal("the master's LMR still has memory after an admin's Free")
			}
			if err := third.Read(ctx, rh, 0, make([]byte, 1)); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("Read after an admin's Free: %v, want REM_ACCESS_ERR", err)
			}
			if _, err := third.Map(ctx, 2, "a", lite.Read); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Map after an admin's Free: %v, want ErrFreed", err)
			}
			if err := admin.Free(ctx, h); !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("second Free: %v, want ErrFreed", err)
			}
		})
	}
}

// TestGrantNameUnguessable: a node the master refused cannot reach a
// grant made for another by guessing its export name: the grant is
// exported under a random name, which only the master and the mapper's
// Node know.
func TestGrantNameUnguessable(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			mapper, master := open(t, api), open(t, others[0])
			malloc(t, master, "secret", 64, 0)
			l := malloc(t, master, "other", 64, lite.Read)
			if err := l.SetPerm(1, lite.Read|lite.Write); err != nil {
				t.Fatal(err)
			}
			mapLMR(t, mapper, 2, "other", lite.Read|lite.Write)
			// Node 3 guesses what a sequential scheme would name node 1's grant.
			for seq := 1; seq <= 64; seq++ {
				guess := fmt.Sprintf("lite/1/%d/other", seq)
				if r, err := others[1].Region(ctx, 2, guess); !errors.Is(err, krcore.ErrNoRegion) {
					t.Fatalf("Region(%q) at node 3: %v, %v; want ErrNoRegion", guess, r, err)
				}
			}
		})
	}
}
