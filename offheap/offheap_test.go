package offheap_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/krcore/krcore/offheap"
	"golang.org/x/sys/unix"
)

func TestFindAndPin(t *testing.T) {
	b, err := offheap.Alloc(10000)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := offheap.Find(make([]byte, 8)); !errors.Is(err, offheap.ErrNotOffHeap) {
		t.Errorf("heap slice: got %v, want ErrNotOffHeap", err)
	}
	blk, off, err := offheap.Find(b.Bytes()[100:200])
	if err != nil || blk != b || off != 100 {
		t.Fatalf("Find: %v %d %v", blk, off, err)
	}
	s, err := offheap.Slice(offheap.Addr(b.Bytes()[5:]), 10)
	if err != nil || &s[0] != &b.Bytes()[5] {
		t.Fatalf("Slice: %v", err)
	}
	if _, err := offheap.Slice(offheap.Addr(b.Bytes()[9999:]), 2); !errors.Is(err, offheap.ErrNotOffHeap) {
		t.Errorf("Slice past the end: got %v", err)
	}
	unpin, err := offheap.Pin(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); !errors.Is(err, offheap.ErrPinned) {
		t.Errorf("Close while pinned: got %v, want ErrPinned", err)
	}
	unpin()
	unpin() // idempotent
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); !errors.Is(err, offheap.ErrClosed) {
		t.Errorf("second Close: got %v", err)
	}
	if _, err := offheap.Alloc(0); err == nil {
		t.Error("Alloc(0) succeeded")
	}
}

func TestSharedMapsSamePages(t *testing.T) {
	a, err := offheap.AllocShared("test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := offheap.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), a.FD()), 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	copy(a.Bytes(), "shared")
	if string(b.Bytes()[:6]) != "shared" {
		t.Fatalf("second mapping sees %q", b.Bytes()[:6])
	}
}

func ExampleAlloc() {
	blk, err := offheap.Alloc(1 << 20)
	if err != nil {
		panic(err)
	}
	defer blk.Close()
	fmt.Println(len(blk.Bytes()), blk.FD())
	// Output: 1048576 -1
}

// TestPopulate: after Populate every page of a fresh block is resident and
// its bytes are what they were, wherever the range starts and ends.
func TestPopulate(t *testing.T) {
	size := 2*offheap.HugePage + 5*os.Getpagesize()
	b, err := offheap.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	buf := b.Bytes()
	buf[3], buf[size-1] = 7, 9
	offheap.Populate(buf[3:])
	offheap.Populate(nil)
	if buf[3] != 7 || buf[size-1] != 9 || buf[4] != 0 {
		t.Fatalf("Populate changed bytes: %d %d %d", buf[3], buf[size-1], buf[4])
	}
	pages := size / os.Getpagesize()
	vec := make([]byte, pages)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Skipf("mincore: %v", e)
	}
	for i, v := range vec {
		if v&1 == 0 {
			t.Fatalf("page %d of %d not resident after Populate", i, pages)
		}
	}
}

// A retired block's memory is released, yet a slice of it a program still
// holds stays harmless: reads give zeros, writes land nowhere that matters,
// and no registration or second release accepts it.
func TestRetire(t *testing.T) {
	for _, shared := range []bool{false, true} {
		var b *offheap.Block
		var err error
		if shared {
			b, err = offheap.AllocShared("retire", 3*os.Getpagesize()+5)
		} else {
			b, err = offheap.Alloc(3*os.Getpagesize() + 5)
		}
		if err != nil {
			t.Fatal(err)
		}
		held := b.Bytes()
		for i := range held {
			held[i] = 0xA5
		}
		unpin, err := offheap.Pin(held)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Retire(); !errors.Is(err, offheap.ErrPinned) {
			t.Fatalf("Retire while pinned: %v, want ErrPinned", err)
		}
		unpin()
		if err := b.Retire(); err != nil {
			t.Fatalf("shared=%v: Retire: %v", shared, err)
		}
		for i, c := range held {
			if c != 0 {
				t.Fatalf("shared=%v: byte %d after Retire = %#x, want 0 (fresh zero page)", shared, i, c)
			}
		}
		held[len(held)-1] = 1 // must not fault
		if _, _, err := offheap.Find(held); !errors.Is(err, offheap.ErrNotOffHeap) {
			t.Errorf("shared=%v: Find of a retired block: %v, want ErrNotOffHeap", shared, err)
		}
		if err := b.Retire(); !errors.Is(err, offheap.ErrClosed) {
			t.Errorf("second Retire: %v, want ErrClosed", err)
		}
		if err := b.Close(); !errors.Is(err, offheap.ErrClosed) {
			t.Errorf("Close after Retire: %v, want ErrClosed", err)
		}
	}
}
