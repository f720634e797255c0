package lite_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// TestAtomics: FetchAdd and CompareSwap on an LMR through a handle run at
// the master's node, checked for alignment and bounds, refused by the
// responder without Atomic; concurrent adders from both nodes (the master
// through a handle on its own LMR) lose no update.
func TestAtomics(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			l, err := master.Malloc(ctx, "words", 64, lite.Read|lite.Atomic)
			if err != nil {
				t.Fatal(err)
			}
			word := func(off int) uint64 { return binary.LittleEndian.Uint64(l.Bytes()[off:]) }
			h, err := mapper.Map(ctx, 2, "words", lite.Atomic)
			if err != nil {
				t.Fatal(err)
			}
			if old, err := mapper.FetchAdd(ctx, h, 8, 5); err != nil || old != 0 {
				t.Fatalf("FetchAdd: %d, %v; want 0", old, err)
			}
			if old, err := mapper.FetchAdd(ctx, h, 8, 2); err != nil || old != 5 || word(8) != 7 {
				t.Fatalf("FetchAdd: %d, %v, word %d; want 5, word 7", old, err, word(8))
			}
			if old, err := mapper.CompareSwap(ctx, h, 8, 7, 42); err != nil || old != 7 || word(8) != 42 {
				t.Fatalf("CompareSwap: %d, %v, word %d; want 7, word 42", old, err, word(8))
			}
			if old, err := mapper.CompareSwap(ctx, h, 8, 7, 1); err != nil || old != 42 || word(8) != 42 {
				t.Fatalf("CompareSwap on a changed word: %d, %v, word %d; want 42 unchanged", old, err, word(8))
			}
			for _, off := range []int{4, 60, 64, -8} {
				if _, err := mapper.FetchAdd(ctx, h, off, 1); !errors.Is(err, krcore.ErrInvalid) {
					t.Fatalf("FetchAdd at %d of 64: %v, want ErrInvalid", off, err)
				}
			}
			if _, err := master.FetchAdd(ctx, h, 8, 1); !errors.Is(err, lite.ErrBadHandle) {
				t.Fatalf("another Node's handle: %v, want ErrBadHandle", err)
			}
			rh, err := mapper.Map(ctx, 2, "words", lite.Read)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mapper.FetchAdd(ctx, rh, 8, 1); !errors.Is(err, verbs.RemAccessErr) {
				t.Fatalf("FetchAdd through a read handle: %v, want REM_ACCESS_ERR", err)
			}
			if _, err := mapper.CompareSwap(ctx, rh, 8, 42, 0); !errors.Is(err, verbs.RemAccessErr) || word(8) != 42 {
				t.Fatalf("CompareSwap through a read handle: %v, word %d; want REM_ACCESS_ERR, 42", err, word(8))
			}

			own, err := master.Map(ctx, 2, "words", lite.Atomic)
			if err != nil {
				t.Fatal(err)
			}
			const each = 50
			var wg sync.WaitGroup
			for i := range 4 {
				n, h := mapper, h
				if i%2 == 0 {
					n, h = master, own
				}
				wg.Go(func() {
					for range each {
						if _, err := n.FetchAdd(ctx, h, 16, 1); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if got := word(16); got != 4*each {
				t.Fatalf("%d concurrent adds left %d", 4*each, got)
			}
		})
	}
}
