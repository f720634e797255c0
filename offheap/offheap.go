//go:build linux

// Package offheap allocates memory outside the Go heap for RDMA registration.
//
// An RNIC reads and writes registered memory behind the Go runtime's back, so
// that memory must never move, must never be freed by the garbage collector,
// and must not be a Go pointer handed to C (cgo's rules). Blocks come from
// mmap: anonymous for private use, or backed by a memfd when another process
// (the krcored daemon, a conformance helper) must map the same pages.
//
// Every live Block is recorded, so a provider can check that a buffer it is
// asked to register is off-heap (Find) and a proxy can learn which memfd and
// offset back a slice.
//
// The package is Linux-only, and so is every package built on it: shared
// blocks are memfds, sealed so that neither side can shrink them under the
// other's mapping.
package offheap

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotOffHeap reports a buffer that does not lie inside a live Block.
var ErrNotOffHeap = errors.New("offheap: buffer is not inside an off-heap block")

// ErrClosed reports use of a Block after Close.
var ErrClosed = errors.New("offheap: block is closed")

// ErrBadSize reports a size that is not positive, too large to map, or
// larger than the file asked to map.
var ErrBadSize = errors.New("offheap: bad size")

// checkSize refuses a size that is not positive or whose page-rounded
// length would overflow an int.
func checkSize(size int) error {
	if size <= 0 || size > math.MaxInt-os.Getpagesize() {
		return fmt.Errorf("%w: %d bytes", ErrBadSize, size)
	}
	return nil
}

// ErrPinned reports a Close of a block that is still registered with an RNIC.
var ErrPinned = errors.New("offheap: block is pinned by a registration")

// Block is one mmap'd range of memory.
type Block struct {
	buf  []byte
	full []byte // the whole page-rounded mapping, for munmap
	fd   int    // memfd, or -1 for anonymous memory
	name string
	pins int // registrations holding the block mapped; guarded by liveMu
}

var (
	liveMu sync.RWMutex
	live   []*Block // sorted by base address
)

// Alloc maps size bytes of private, zeroed, page-aligned memory.
func Alloc(size int) (*Block, error) {
	if err := checkSize(size); err != nil {
		return nil, fmt.Errorf("offheap: alloc: %w", err)
	}
	buf, err := unix.Mmap(-1, 0, pageRound(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("offheap: mmap %d bytes: %w", size, err)
	}
	return track(&Block{buf: buf[:size:size], full: buf, fd: -1}), nil
}

// AllocShared maps size bytes backed by a new memfd called name, so the same
// pages can be mapped by another process through FD (SCM_RIGHTS or
// /proc/PID/fd/N) and Open.
func AllocShared(name string, size int) (*Block, error) {
	if err := checkSize(size); err != nil {
		return nil, fmt.Errorf("offheap: alloc shared %q: %w", name, err)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("offheap: memfd_create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(pageRound(size))); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("offheap: size memfd %q to %d: %w", name, size, err)
	}
	// Sealed to its size: a process that maps it (krcored) must not take
	// SIGBUS because this one shrank the file under its mapping.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sizeSeals|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("offheap: seal memfd %q: %w", name, err)
	}
	b, err := mapShared(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	b.name = name
	return b, nil
}

// Open maps size bytes of an existing memfd (or any shareable file). The
// Block takes ownership of fd and closes it with the Block.
func Open(fd int, size int) (*Block, error) {
	if err := checkSize(size); err != nil {
		return nil, fmt.Errorf("offheap: open fd %d: %w", fd, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("offheap: open fd %d: %w", fd, err)
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("offheap: open fd %d: file has %d bytes, want %d: %w", fd, st.Size, size, ErrBadSize)
	}
	return mapShared(fd, size)
}

// sizeSeals fix a memfd's size.
const sizeSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// ErrNotSealed reports a memfd whose size its sender could still change.
var ErrNotSealed = errors.New("offheap: memfd is not sealed against shrinking")

// OpenSealed is Open for a memfd from a less trusted process: the memfd must
// be sealed against shrinking (AllocShared's are), or the sender could shrink
// it and crash the mapper with SIGBUS. Open's size check then holds for good.
// On error fd stays the caller's.
func OpenSealed(fd int, size int) (*Block, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("offheap: open fd %d: %w: %w", fd, ErrNotSealed, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("offheap: open fd %d: %w", fd, ErrNotSealed)
	}
	return Open(fd, size)
}

// OpenFile maps size bytes of the file at path (e.g. /proc/PID/fd/N).
func OpenFile(path string, size int) (*Block, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("offheap: %w", err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("offheap: dup %s: %w", path, err)
	}
	b, err := Open(fd, size)
	if err != nil {
		unix.Close(fd)
	}
	return b, err
}

func mapShared(fd, size int) (*Block, error) {
	buf, err := unix.Mmap(fd, 0, pageRound(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("offheap: mmap memfd %d (%d bytes): %w", fd, size, err)
	}
	return track(&Block{buf: buf[:size:size], full: buf, fd: fd}), nil
}

func pageRound(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

func track(b *Block) *Block {
	liveMu.Lock()
	defer liveMu.Unlock()
	i := sort.Search(len(live), func(i int) bool { return live[i].base() >= b.base() })
	live = append(live, nil)
	copy(live[i+1:], live[i:])
	live[i] = b
	return b
}

func (b *Block) base() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b.buf))) }

// Bytes returns the block's memory. The slice is valid until Close.
func (b *Block) Bytes() []byte { return b.buf }

// HugePage is the size of a transparent huge page (x86-64, arm64 with 4 KiB
// pages): memory aligned to it that Populate asks to be backed by huge
// pages takes one fault for each HugePage bytes instead of one a page.
const HugePage = 2 << 20

// Populate faults in every page of buf (which must lie in mapped memory,
// such as a Block's) writable, now, leaving its bytes as they are, and asks
// for transparent huge pages where buf spans whole aligned ones. Memory a
// peer writes into at message rate (a ring of receive buffers) would
// otherwise take a page fault at each page's first write, on the data
// path: on a VM 5-20 us a page, the fault of the guest and the hypervisor's
// first backing of the page, where a populated 4 MiB ring on huge pages
// costs about 1 ms once. An RNIC's registration pins, and so faults in,
// the memory it registers in the same way.
func Populate(buf []byte) {
	if len(buf) == 0 {
		return
	}
	start := int(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	lo := (HugePage - start%HugePage) % HugePage // offset of the first huge page boundary
	if whole := (len(buf) - lo) &^ (HugePage - 1); lo < len(buf) && whole > 0 {
		// Only a hint: where the kernel has no huge pages to give (THP
		// off), the pages are faulted in one by one below all the same.
		_ = unix.Madvise(buf[lo:lo+whole], unix.MADV_HUGEPAGE)
	}
	// An atomic add of zero writes without changing a byte: the page is
	// faulted in writable, as a later write needs it. Words are aligned:
	// the first from buf's start, the others at page starts.
	p := os.Getpagesize()
	for off := (4 - start%4) % 4; off+4 <= len(buf); off = (start+off+p)&^(p-1) - start {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&buf[off])), 0)
	}
}

// Len returns the block's size in bytes.
func (b *Block) Len() int { return len(b.buf) }

// FD returns the memfd behind a shared block, or -1 for private memory.
func (b *Block) FD() int { return b.fd }

// Close unmaps the block (and closes its memfd). Any slice of it becomes
// invalid: the caller must have deregistered it from every RNIC first.
func (b *Block) Close() error {
	if err := b.untrack(); err != nil {
		return err
	}
	return b.finish(unix.Munmap(b.full))
}

// Retire releases the block as Close does, its pages and its memfd, but
// leaves its addresses mapped to fresh private zero pages, never handed
// out again, instead of unmapping them. It is for teardown of memory whose
// slices a program may still hold when it cannot know that they are
// dropped (an MR's Bytes when the runtime that allocated it closes): a late
// access then reads zeros and writes harmlessly where after Close it would
// kill the process with SIGSEGV. The cost is the address range alone (no
// memory until a late write touches a page), so Retire is for teardown,
// once per block, not for the churn of Deregister.
func (b *Block) Retire() error {
	if err := b.untrack(); err != nil {
		return err
	}
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b.full)), uintptr(len(b.full)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil { // the old mapping is still in place: unmap it after all
		err = unix.Munmap(b.full)
	}
	return b.finish(err)
}

// untrack removes b from the live blocks, unless it is gone or pinned.
func (b *Block) untrack() error {
	liveMu.Lock()
	defer liveMu.Unlock()
	i := sort.Search(len(live), func(i int) bool { return live[i].base() >= b.base() })
	if i == len(live) || live[i] != b {
		return ErrClosed
	}
	if pins := b.pins; pins > 0 {
		return fmt.Errorf("%w (%d registrations)", ErrPinned, pins)
	}
	live = append(live[:i], live[i+1:]...)
	return nil
}

// finish closes b's memfd after its mapping went (unmapErr: how that went).
func (b *Block) finish(unmapErr error) error {
	err := unmapErr
	if b.fd >= 0 {
		if cerr := unix.Close(b.fd); err == nil {
			err = cerr
		}
	}
	b.buf, b.full = nil, nil
	if err != nil {
		return fmt.Errorf("offheap: unmap: %w", err)
	}
	return nil
}

// Find returns the live Block that holds all of buf and buf's offset in it.
// It fails with ErrNotOffHeap for Go heap memory, stack memory, or a buffer
// that straddles blocks.
func Find(buf []byte) (*Block, int, error) {
	if len(buf) == 0 {
		return nil, 0, fmt.Errorf("%w: empty buffer", ErrNotOffHeap)
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	liveMu.RLock()
	defer liveMu.RUnlock()
	i := sort.Search(len(live), func(i int) bool { return live[i].base() > p }) - 1
	if i < 0 {
		return nil, 0, ErrNotOffHeap
	}
	b := live[i]
	off := int(p - b.base())
	if off+len(buf) > len(b.buf) {
		return nil, 0, ErrNotOffHeap
	}
	return b, off, nil
}

// Pin keeps the block holding buf mapped until the returned unpin is called:
// Close fails with ErrPinned meanwhile. A software RNIC pins what it
// registers, because unmapping memory it may still copy into would crash the
// process where real hardware would merely keep writing pinned pages.
func Pin(buf []byte) (unpin func(), err error) {
	b, _, err := Find(buf)
	if err != nil {
		return nil, err
	}
	liveMu.Lock()
	b.pins++
	liveMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			liveMu.Lock()
			b.pins--
			liveMu.Unlock()
		})
	}, nil
}

// Addr returns the virtual address of buf's first byte, the address an RNIC
// uses for it in scatter/gather entries and remote operations.
func Addr(buf []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// Slice returns the live off-heap memory at virtual address addr, n bytes
// long: how a CPU-side copy (an inline send) reads memory named only by its
// address without trusting that address.
func Slice(addr uint64, n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative length %d", ErrNotOffHeap, n)
	}
	liveMu.RLock()
	defer liveMu.RUnlock()
	p := uintptr(addr)
	i := sort.Search(len(live), func(i int) bool { return live[i].base() > p }) - 1
	if i < 0 {
		return nil, ErrNotOffHeap
	}
	b := live[i]
	// In uintptr: an address far above the block (2^63 past it or more)
	// would turn negative as an int offset and pass a signed check.
	off, size := p-b.base(), uintptr(len(b.buf))
	if off > size || uintptr(n) > size-off {
		return nil, ErrNotOffHeap
	}
	return b.buf[off : off+uintptr(n) : off+uintptr(n)], nil
}
