//go:build linux && cgo && rdma

package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krcore/krcore/verbs"
)

// cq is a completion queue with its own completion channel. The channel's
// fd is non-blocking and watched by the Go netpoller, so Wait sleeps
// without a thread and honours its context.
type cq struct {
	d   *device
	c   *cCQ
	ch  *cChannel
	cap int

	// f is a dup of the channel fd owned by the netpoller. Closing it wakes
	// waiters; libibverbs closes the original with the channel.
	f  *os.File
	rc syscall.RawConn

	mu      sync.Mutex // guards the fields below and the C scratch
	closed  bool
	nqp     int          // QPs completing into it
	pending []verbs.WC   // completions Wait took to close the notify race
	scratch *pollScratch // C memory for ibv_poll_cq

	waitMu sync.Mutex // one Wait at a time owns the fd's deadline
}

// CreateCQ creates a CQ of at least cqe entries.
func (d *device) CreateCQ(cqe int) (verbs.CQ, error) {
	if err := d.own("CreateCQ"); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if cqe <= 0 || cqe > d.info.attr.MaxCQE {
		return nil, fmt.Errorf("ibverbs: CreateCQ(%d): want 1..%d entries: %w", cqe, d.info.attr.MaxCQE, verbs.ErrLimit)
	}
	c, ch, got, fd, err := createCQ(d.ctx, cqe)
	if err != nil {
		return nil, err
	}
	q := &cq{d: d, c: c, ch: ch, cap: got, scratch: newPollScratch()}
	if err := q.openFile(fd); err != nil {
		destroyCQ(c, ch)
		q.scratch.free()
		return nil, err
	}
	d.cqs[q] = struct{}{}
	return q, nil
}

func (q *cq) openFile(fd int) error {
	// O_NONBLOCK lives on the open file description, so setting it on the
	// dup makes libibverbs' read of the original non-blocking too.
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ibverbs: dup completion channel fd: %w", err)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return fmt.Errorf("ibverbs: completion channel fd non-blocking: %w", err)
	}
	q.f = os.NewFile(uintptr(nfd), "ibv_comp_channel")
	rc, err := q.f.SyscallConn()
	if err != nil {
		q.f.Close()
		return fmt.Errorf("ibverbs: completion channel raw conn: %w", err)
	}
	q.rc = rc
	return nil
}

// Cap is the number of entries the device granted.
func (q *cq) Cap() int { return q.cap }

// Poll moves up to len(wc) completions into wc: first those Wait already
// took, then the device's, translated back to the caller's IDs.
func (q *cq) Poll(wc []verbs.WC) (int, error) {
	if err := q.d.use("Poll"); err != nil {
		return 0, err
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("ibverbs: Poll: CQ: %w", verbs.ErrClosed)
	}
	n := copy(wc, q.pending)
	q.pending = q.pending[:copy(q.pending, q.pending[n:])]
	for n < len(wc) {
		k, err := q.pollLocked(wc[n:])
		n += k
		if err != nil {
			return n, err
		}
		if k == 0 {
			break
		}
	}
	return n, nil
}

// pollLocked polls the device once (up to pollBatch) into out.
func (q *cq) pollLocked(out []verbs.WC) (int, error) {
	k, err := pollCQ(q.c, min(len(out), pollBatch), q.scratch.tmp, q.scratch.out)
	if err != nil {
		return 0, err
	}
	for i, w := range wcSlice(q.scratch.out, k) {
		out[i] = q.d.translate(&w)
	}
	return k, nil
}

// translate turns a device completion into a verbs.WC: the status keeps
// ibv_wc_status's number (verbs.Status is numbered alike), the ID goes back
// to the caller's, and the QP's queue accounting learns the slot is free.
func (d *device) translate(w *cWC) verbs.WC {
	id, status, opcode, byteLen, imm, qpn, srcQP, flags := wcFields(w)
	wc := verbs.WC{
		ID:      id,
		Status:  verbs.Status(status),
		ByteLen: byteLen,
		QPN:     qpn,
		SrcQPN:  srcQP,
	}
	if flags&wcFlagWithImm != 0 {
		wc.Imm, wc.HasImm = imm, true
	}
	switch opcode {
	case wcOpSend:
		wc.Op = verbs.WCSend
	case wcOpWrite:
		wc.Op = verbs.WCWrite
	case wcOpRead:
		wc.Op = verbs.WCRead
	case wcOpCompSwap:
		wc.Op = verbs.WCCompareSwap
	case wcOpFetchAdd:
		wc.Op = verbs.WCFetchAdd
	case wcOpRecv:
		wc.Op = verbs.WCRecv
	case wcOpRecvImm:
		wc.Op = verbs.WCRecvWriteImm
	}
	if qp := d.qps[qpn]; qp != nil {
		qp.complete(&wc)
	}
	return wc
}

// Wait blocks until a completion is ready for Poll, the CQ or device
// closes (ErrClosed), or ctx ends (its error). It arms the CQ, polls once
// to catch completions that came before the arming, and otherwise sleeps
// on the completion channel through the netpoller.
func (q *cq) Wait(ctx context.Context) error {
	q.waitMu.Lock()
	defer q.waitMu.Unlock()
	for {
		ready, err := q.arm()
		if err != nil || ready {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := q.sleep(ctx); err != nil {
			return err
		}
	}
}

// arm requests a notification and reports whether completions are already
// there (kept in pending for Poll).
func (q *cq) arm() (bool, error) {
	if err := q.d.use("Wait"); err != nil {
		return false, err
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, fmt.Errorf("ibverbs: Wait: CQ: %w", verbs.ErrClosed)
	}
	if len(q.pending) > 0 {
		return true, nil
	}
	if err := reqNotify(q.c); err != nil {
		return false, err
	}
	var buf [pollBatch]verbs.WC
	k, err := q.pollLocked(buf[:])
	q.pending = append(q.pending, buf[:k]...)
	return k > 0, err
}

// sleep waits for one completion event, ctx's end, or the CQ's close.
func (q *cq) sleep(ctx context.Context) error {
	dl, _ := ctx.Deadline() // zero time: no deadline
	if err := q.f.SetReadDeadline(dl); err != nil {
		return q.closedOr(fmt.Errorf("ibverbs: Wait: set deadline: %w", err))
	}
	// Cancellation without a deadline: move the deadline into the past.
	// done lets us wait for a cancellation in flight, so it cannot land
	// on the next Wait's deadline.
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		q.f.SetReadDeadline(time.Unix(1, 0))
		close(done)
	})
	var evErr error
	err := q.rc.Read(func(uintptr) bool {
		evErr = getCQEvent(q.ch)
		return evErr != errAgain
	})
	if !stop() {
		<-done
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		// The netpoller's deadline can fire a moment before the context's
		// timer. Callers test ctx.Err() after Wait fails, so wait for the
		// context (due now: its deadline has passed) and report its error.
		if errors.Is(err, os.ErrDeadlineExceeded) && !dl.IsZero() && !time.Now().Before(dl) {
			<-ctx.Done()
			return ctx.Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil // a stale cancellation deadline: Wait loops and re-arms
		}
		return q.closedOr(fmt.Errorf("ibverbs: Wait on completion channel: %w", err))
	}
	return evErr
}

// closedOr returns ErrClosed if the CQ is closed (its file was closed under
// a waiter), else err.
func (q *cq) closedOr(err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("ibverbs: Wait: CQ: %w", verbs.ErrClosed)
	}
	return err
}

// wakeClosed marks the CQ closed and closes the netpoller's fd, which ends
// every Wait. The C objects go later, under the device lock.
func (q *cq) wakeClosed() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.f.Close()
}

// Close destroys the CQ; it fails with ErrBusy while QPs complete into it.
func (q *cq) Close() error {
	if err := q.d.own("close CQ"); err != nil {
		return err
	}
	defer q.d.mu.Unlock()
	q.mu.Lock()
	closed, busy := q.closed, q.nqp
	q.mu.Unlock()
	if closed {
		return fmt.Errorf("ibverbs: close CQ: %w", verbs.ErrClosed)
	}
	if busy > 0 {
		return fmt.Errorf("ibverbs: close CQ used by %d QPs: %w", busy, verbs.ErrBusy)
	}
	delete(q.d.cqs, q)
	return q.destroyLocked()
}

// destroyLocked frees the C objects; the device lock is held exclusively.
func (q *cq) destroyLocked() error {
	// A Wait sleeps on the file without the device lock: closing the file
	// wakes it (and returns only once no read callback runs), and it then
	// finds the CQ closed.
	q.wakeClosed()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c == nil {
		return nil
	}
	err := destroyCQ(q.c, q.ch)
	q.c, q.ch = nil, nil
	q.scratch.free()
	return err
}
