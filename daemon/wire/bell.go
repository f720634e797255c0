//go:build linux

package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
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
	f *os.File
	// mu and sleeps order a Sleep's reset of the read deadline against
	// the deadline its context's end sets: that runs on a goroutine of its
	// own (context.AfterFunc) and may come after Sleep returned, when it
	// must not cut the next Sleep short.
	mu     sync.Mutex
	sleeps uint64
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
	return &Bell{f: os.NewFile(uintptr(fd), "eventfd")}
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
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	rc, err := b.f.SyscallConn()
	if err != nil {
		return // closed
	}
	rc.Write(func(fd uintptr) bool {
		unix.Write(int(fd), one[:]) // EAGAIN: full, a wake-up is pending
		return true
	})
}

// Sleep blocks until the bell rings, ctx ends or the bell closes.
func (b *Bell) Sleep(ctx context.Context) error {
	b.mu.Lock()
	b.sleeps++
	this := b.sleeps
	err := b.f.SetReadDeadline(time.Time{})
	b.mu.Unlock()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.sleeps == this {
			b.f.SetReadDeadline(time.Now())
		}
	})
	defer stop()
	var buf [8]byte
	_, err = b.f.Read(buf[:])
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Close closes the eventfd; a Sleep in progress returns.
func (b *Bell) Close() error { return b.f.Close() }

// ErrBellClosed is what Wait returns when its bell closed under it.
var ErrBellClosed = errors.New("wire: bell closed")

// Wait returns when ready reports true: it polls for SpinFor, then raises
// flag (Publish), checks again and sleeps on bell until woken, ctx ends or stop
// reports an error (the other side gone).
func Wait(ctx context.Context, ready func() bool, flag *atomic.Uint64, bell *Bell, stop func() error) error {
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
		if time.Since(start) < SpinFor {
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

// Notify rings bell if the other side sleeps on flag; call it after
// publishing (Publish).
func Notify(flag *atomic.Uint64, bell *Bell) {
	if flag.Load() != 0 {
		bell.Ring()
	}
}
