//go:build linux

package wire

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SpinFor is how long a waiter polls shared memory before it sleeps: a
// cross-process hop is ~0.3 us when the other side spins and ~7 us through a
// sleep, so a few microseconds of spinning catch a completion on its way
// without holding one of two cores for long.
const SpinFor = 10 * time.Microsecond

// Bell is an eventfd one side writes to wake the other.
type Bell struct {
	f  *os.File
	rc syscall.RawConn // f's, kept: SyscallConn allocates per call
	// mu orders a Sleep against the read deadline its context's end sets:
	// that runs on a goroutine of its own (context.AfterFunc), maybe after
	// Sleep returned or after a later Sleep registered another context,
	// when it must not cut that Sleep short. The registration outlives a
	// Sleep (see watch), so gen names the current one.
	mu       sync.Mutex
	sleeping bool            // a Sleep is reading
	deadline bool            // an interrupt set the read deadline
	gen      uint64          // the current registration, see interrupt
	wdone    <-chan struct{} // the registered context's Done
	wstop    func() bool
}

// NewBell makes an eventfd.
func NewBell() (*Bell, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("wire: eventfd: %w", err)
	}
	return BellFromFD(fd), nil
}

// BellFromFD adopts an eventfd (received over the socket).
func BellFromFD(fd int) *Bell {
	unix.SetNonblock(fd, true) // so reads go through Go's poller
	f := os.NewFile(uintptr(fd), "eventfd")
	rc, _ := f.SyscallConn() // fails only for a nil or closed file
	return &Bell{f: f, rc: rc}
}

// CheckEventfd reports an error unless fd is an eventfd: a bell from a
// less trusted process could be a file or device that is always readable
// (its watcher would spin) or a pipe.
func CheckEventfd(fd int) error {
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return fmt.Errorf("wire: bell fd %d: %w", fd, err)
	}
	if target != "anon_inode:[eventfd]" {
		return fmt.Errorf("wire: bell fd %d is %s, not an eventfd", fd, target)
	}
	return nil
}

// FD is the eventfd, to pass to the other side.
func (b *Bell) FD() int { return int(b.f.Fd()) }

// Ring wakes the waiter. It never blocks: a full counter means a wake-up is
// pending anyway. The write is one non-blocking write(2), not os.File's
// Write, which waits in the poller for room: a peer that never reads its
// bell (an eventfd it filled, or a pipe passed as one) would hold the
// ringing goroutine for good.
func (b *Bell) Ring() {
	if b.rc == nil {
		return
	}
	b.rc.Write(ringFD) // fails only when closed
}

// one is the eventfd increment Ring writes, little-endian.
var one = [8]byte{1}

// ringFD writes one to an eventfd; EAGAIN means full, a wake-up is
// pending. A function, not a closure, so Ring allocates nothing.
func ringFD(fd uintptr) bool {
	unix.Write(int(fd), one[:])
	return true
}

// Sleep blocks until the bell rings, ctx ends or the bell closes. One
// goroutine at a time sleeps on a bell (its users take a token first).
func (b *Bell) Sleep(ctx context.Context) error {
	if err := b.arm(ctx); err != nil {
		return err
	}
	var buf [8]byte
	_, err := b.f.Read(buf[:])
	b.mu.Lock()
	b.sleeping = false
	b.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// arm readies a Sleep on ctx: ctx's end will interrupt the read, and no
// deadline left by an earlier interrupt cuts it short. It fails if ctx
// has ended already (its interrupt may have run before sleeping was set).
func (b *Bell) arm(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.watch(ctx)
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.deadline {
		if err := b.f.SetReadDeadline(time.Time{}); err != nil {
			return err
		}
		b.deadline = false
	}
	b.sleeping = true
	return nil
}

// watch makes the end of ctx interrupt the Sleep in progress. The
// registration stays for the next Sleep with the same context: a waiter
// that bounds every wait with one deadline (a VQ's, a benchmark's) would
// otherwise allocate a registration per sleep (context.AfterFunc: 4
// allocations), the most of what a request through krcored allocated.
// b.mu held.
func (b *Bell) watch(ctx context.Context) {
	done := ctx.Done()
	if done == b.wdone {
		return
	}
	b.unwatch()
	if done == nil {
		return
	}
	b.gen++
	gen := b.gen
	b.wdone, b.wstop = done, context.AfterFunc(ctx, func() { b.interrupt(gen) })
}

// unwatch drops watch's registration; b.mu held.
func (b *Bell) unwatch() {
	if b.wstop != nil {
		b.wstop()
	}
	b.gen++ // an interrupt already running for it does nothing
	b.wdone, b.wstop = nil, nil
}

// interrupt ends the Sleep in progress, if registration gen is still the
// current one: its context ended.
func (b *Bell) interrupt(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen == b.gen && b.sleeping {
		b.f.SetReadDeadline(time.Now())
		b.deadline = true
	}
}

// Close closes the eventfd; a Sleep in progress returns.
func (b *Bell) Close() error {
	b.mu.Lock()
	b.unwatch()
	b.mu.Unlock()
	return b.f.Close()
}

// ErrBellClosed is what Wait returns when its bell closed under it.
var ErrBellClosed = errors.New("wire: bell closed")

// Wait returns when ready reports true: it polls for spin (SpinFor, or 0
// when what it waits for cannot come that soon), then raises flag
// (Publish), checks again and sleeps on bell until woken, ctx ends or stop
// reports an error (the other side gone).
func Wait(ctx context.Context, spin time.Duration, ready func() bool, flag *atomic.Uint64, bell *Bell, stop func() error) error {
	start := time.Now()
	for i := 0; ; i++ {
		if ready() {
			return nil
		}
		if err := stop(); err != nil {
			return err
		}
		if i%16 != 15 {
			continue
		}
		if time.Since(start) < spin {
			runtime.Gosched()
			continue
		}
		Publish(flag, 1)
		if ready() {
			flag.Store(0)
			return nil
		}
		err := bell.Sleep(ctx)
		flag.Store(0)
		if errors.Is(err, os.ErrClosed) {
			return ErrBellClosed
		}
		if err != nil {
			return err
		}
	}
}

// Publish stores v in c as the first half of a wake-up handshake: store,
// then load the other side's flag or counter, while the other side does
// the same the other way round, so that at least one of them sees the
// other's write. That needs a store no later load may pass. It is a Swap:
// on amd64 Store and Swap are the same XCHG, but under the race detector
// Store is only a release store (golang/go#58020), a load may pass it, and
// both sides could miss each other and sleep for good (a Connect through
// krcored waited out its deadline that way).
func Publish(c *atomic.Uint64, v uint64) { c.Swap(v) }

// Notify rings bell if the other side sleeps on flag, and reports whether
// it did; call it after publishing (Publish).
func Notify(flag *atomic.Uint64, bell *Bell) bool {
	if flag.Load() == 0 {
		return false
	}
	bell.Ring()
	return true
}
