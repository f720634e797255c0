// Package rawqp drives raw verbs RC QPs the way perftest does, for
// krbench's raw tests and the raw side of every KRCore comparison: an
// Endpoint (PD, one CQ, an RC QP, an MR over off-heap memory) with its
// request loops (one at a time, ping-pong, echo, sink, a window in flight),
// and the Poller that waits for their completions (a bounded spin, then a
// blocking wait with a deadline, from a Deadline that vqrun's VQ loops
// share).
package rawqp

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// Endpoint is one side's verbs objects for a test, what perftest calls its
// context: a PD, one CQ for sends and receives, an RC QP and an MR over an
// off-heap buffer.
type Endpoint struct {
	PD     verbs.PD
	CQ     verbs.CQ
	QP     verbs.QP
	MR     verbs.MR
	buf    *offheap.Block
	ownBuf bool
	Inline int // payloads up to this size are posted inline

	recvWRs []verbs.RecvWR // reused by postRecvs
}

// Shape sizes an Endpoint's queues.
type Shape struct {
	SendDepth, RecvDepth, Inline int
	// Shared maps the endpoint's own buffer from a memfd
	// (offheap.AllocShared): a soft RNIC's shared-memory link then reads
	// and writes it in place when a peer targets it.
	Shared bool
}

// AllocBuf maps an off-heap buffer of at least size bytes (and at least 8,
// for atomics), rounded up to whole pages: the memory is mapped by the page
// anyway, and a test may use all of it.
func AllocBuf(size int) (*offheap.Block, error) { return allocBuf(size, false) }

// allocBuf is AllocBuf, from a memfd if shared.
func allocBuf(size int, shared bool) (*offheap.Block, error) {
	page := os.Getpagesize()
	size = (max(size, 8) + page - 1) / page * page
	var b *offheap.Block
	var err error
	if shared {
		b, err = offheap.AllocShared("krbench-mr", size)
	} else {
		b, err = offheap.Alloc(size)
	}
	if err != nil {
		return nil, fmt.Errorf("allocate %d B buffer: %w", size, err)
	}
	return b, nil
}

// NewEndpoint creates PD, CQ, QP and MR on dev. buf, if not nil, is
// registered instead of a new buffer of size bytes and stays the caller's.
func NewEndpoint(dev verbs.Device, buf *offheap.Block, size int, sh Shape) (_ *Endpoint, err error) {
	e := &Endpoint{buf: buf}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if e.buf == nil {
		if e.buf, err = allocBuf(size, sh.Shared); err != nil {
			return nil, err
		}
		e.ownBuf = true
	}
	attr := dev.Attr()
	if sh.SendDepth > attr.MaxQPWR || sh.RecvDepth > attr.MaxQPWR {
		return nil, fmt.Errorf("queue depth %d/%d exceeds the device's %d: %w", sh.SendDepth, sh.RecvDepth, attr.MaxQPWR, verbs.ErrLimit)
	}
	e.Inline = min(sh.Inline, attr.MaxInline)
	if e.PD, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	if e.CQ, err = dev.CreateCQ(sh.SendDepth + sh.RecvDepth + 16); err != nil {
		return nil, fmt.Errorf("create CQ: %w", err)
	}
	e.QP, err = e.PD.CreateQP(verbs.QPInit{
		Type: verbs.RC, SendCQ: e.CQ, RecvCQ: e.CQ,
		Cap: verbs.QPCap{MaxSendWR: sh.SendDepth, MaxRecvWR: max(sh.RecvDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: max(e.Inline, 0)},
	})
	if err != nil {
		return nil, fmt.Errorf("create RC QP: %w", err)
	}
	if e.MR, err = e.PD.RegMR(e.buf.Bytes(), verbs.AccessAll); err != nil {
		return nil, fmt.Errorf("register %d B MR: %w", e.buf.Len(), err)
	}
	return e, nil
}

// Remote is what the peer needs to reach e's MR.
func (e *Endpoint) Remote() *control.MR {
	return &control.MR{Addr: e.MR.Addr(), RKey: e.MR.RKey(), Len: e.MR.Len()}
}

// Connect brings e's QP to RTS towards the peer QP at remote.
func (e *Endpoint) Connect(remote verbs.Endpoint) error {
	return verbs.Connect(e.QP, remote, verbs.Path{})
}

// Close destroys everything in reverse order of creation, reporting every
// failure: a leak here would skew the next test.
func (e *Endpoint) Close() error {
	var errs []error
	if e.QP != nil {
		errs = append(errs, e.QP.Close())
	}
	if e.MR != nil {
		errs = append(errs, e.MR.Close())
	}
	if e.CQ != nil {
		errs = append(errs, e.CQ.Close())
	}
	if e.PD != nil {
		errs = append(errs, e.PD.Close())
	}
	if e.ownBuf && e.buf != nil {
		errs = append(errs, e.buf.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release verbs objects: %w", err)
	}
	return nil
}

// PostRecvs posts n receives of the whole MR. Every receive names the same
// bytes: a benchmark does not look at the data, as in perftest. The request
// slice is built once and reused, so the latency loops do not allocate.
func (e *Endpoint) PostRecvs(n int) error {
	if len(e.recvWRs) < n {
		sge := []verbs.SGE{verbs.SGEOf(e.MR, 0, e.MR.Len())}
		e.recvWRs = make([]verbs.RecvWR, n)
		for i := range e.recvWRs {
			e.recvWRs[i] = verbs.RecvWR{ID: RecvID, SGL: sge}
		}
	}
	if k, err := e.QP.PostRecv(e.recvWRs[:n]); err != nil {
		return fmt.Errorf("post receive %d of %d: %w", k+1, n, err)
	}
	return nil
}

// RecvID marks receive completions; send work requests count from 0.
const RecvID = ^uint64(0)

// SpinYield is how many empty polls pass between yields to the scheduler.
const SpinYield = 16

// ErrNoCompletion reports a wait that outlived the timeout.
var ErrNoCompletion = errors.New("no completion before the deadline (is the peer alive?)")

// Spec is one kind of request a test repeats.
type Spec struct {
	Op     verbs.Opcode
	Size   int
	Remote control.MR // one-sided ops: the peer's MR
	Cmp    uint64     // atomics
	Swap   uint64
}

// WR builds the request for s from e's MR at offset 0.
func (e *Endpoint) WR(s Spec) verbs.SendWR {
	w := verbs.SendWR{Op: s.Op, SGL: []verbs.SGE{verbs.SGEOf(e.MR, 0, s.Size)}}
	if s.Op != verbs.OpSend && s.Op != verbs.OpSendImm {
		w.RemoteAddr, w.RKey = s.Remote.Addr, s.Remote.RKey
	}
	if s.Op.IsAtomic() {
		w.CompareAdd, w.Swap = s.Cmp, s.Swap
	}
	if (s.Op == verbs.OpSend || s.Op == verbs.OpWrite) && s.Size <= e.Inline {
		w.Flags |= verbs.Inline
	}
	return w
}

// Latency runs warmup+iters one-sided requests one at a time, each
// signaled, and returns the iters measured post-to-completion times.
func (e *Endpoint) Latency(p *Poller, s Spec, warmup, iters int) ([]time.Duration, error) {
	wrs := []verbs.SendWR{e.WR(s)}
	wrs[0].Flags |= verbs.Signaled
	// Built only on failure: formatting would cost more than an in-memory
	// READ, and the connect test times this call.
	what := func(i int) string { return fmt.Sprintf("%s %d B #%d", s.Op, s.Size, i) }
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		wrs[0].ID = uint64(i)
		t0 := time.Now()
		if _, err := e.QP.PostSend(wrs); err != nil {
			return nil, fmt.Errorf("post %s: %w", what(i), err)
		}
		wcs, err := p.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what(i), err)
		}
		d := time.Since(t0)
		// One request in flight, so exactly one completion comes back.
		if len(wcs) != 1 || wcs[0].ID != uint64(i) {
			return nil, fmt.Errorf("%s: got %d completions (first ID %d), want 1 for this request", what(i), len(wcs), wcs[0].ID)
		}
		if wcs[0].Status != verbs.Success {
			return nil, fmt.Errorf("%s: %w", what(i), wcs[0].Err())
		}
		if i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// PingPong is the client half of the SEND latency test: send, wait for the
// server's echo, repeat. Receives must be posted already. It returns the
// measured round trips.
func (e *Endpoint) PingPong(p *Poller, size, warmup, iters int) ([]time.Duration, error) {
	return e.PingPongOp(p, Spec{Op: verbs.OpSend, Size: size}, warmup, iters)
}

// PingPongOp is PingPong with s's request, any that consumes a receive at
// the peer (SEND, or WRITE_WITH_IMM into the peer's MR at s.Remote).
func (e *Endpoint) PingPongOp(p *Poller, s Spec, warmup, iters int) ([]time.Duration, error) {
	size := s.Size
	wrs := []verbs.SendWR{e.WR(s)}
	wrs[0].Flags |= verbs.Signaled
	samples := make([]time.Duration, 0, iters)
	sendsDone := 0
	for i := range warmup + iters {
		wrs[0].ID = uint64(i)
		t0 := time.Now()
		if _, err := e.QP.PostSend(wrs); err != nil {
			return nil, fmt.Errorf("post %s %d B #%d: %w", s.Op, size, i, err)
		}
		var rtt time.Duration
		got := false
		// Wait for the echo and for our own SEND's completion, whichever
		// comes first; the round trip ends at the echo.
		for !got || sendsDone <= i {
			wcs, err := p.Next()
			now := time.Now()
			if err != nil {
				return nil, fmt.Errorf("%s ping-pong %d B #%d: %w", s.Op, size, i, err)
			}
			for k := range wcs {
				wc := &wcs[k]
				if wc.Status != verbs.Success { // formatted only then: it costs as much as an in-memory SEND
					return nil, CheckWC(wc, fmt.Sprintf("%s ping-pong %d B #%d", s.Op, size, i))
				}
				if wc.ID != RecvID {
					sendsDone++
					continue
				}
				if got {
					return nil, fmt.Errorf("%s ping-pong #%d: two echoes for one request", s.Op, i)
				}
				got, rtt = true, now.Sub(t0)
				if err := e.PostRecvs(1); err != nil {
					return nil, err
				}
			}
		}
		if i >= warmup {
			samples = append(samples, rtt)
		}
	}
	return samples, nil
}

// Echo is the server half of the SEND latency test: answer each of total
// receives with a SEND of size bytes.
func (e *Endpoint) Echo(p *Poller, size, total int) error {
	return e.EchoOp(p, Spec{Op: verbs.OpSend, Size: size}, total)
}

// EchoOp is Echo answering with s's request (see PingPongOp).
func (e *Endpoint) EchoOp(p *Poller, s Spec, total int) error {
	size := s.Size
	wrs := []verbs.SendWR{e.WR(s)}
	wrs[0].Flags |= verbs.Signaled
	recvs, sends := 0, 0
	for recvs < total || sends < recvs {
		wcs, err := p.Next()
		if err != nil {
			return fmt.Errorf("echo %d B after %d of %d: %w", size, recvs, total, err)
		}
		for k := range wcs {
			wc := &wcs[k]
			if wc.Status != verbs.Success { // formatted only then, as in PingPongOp
				return CheckWC(wc, fmt.Sprintf("echo %d B #%d", size, recvs))
			}
			if wc.ID != RecvID {
				sends++
				continue
			}
			// Repost before answering: the client's next SEND can only
			// come after our answer, so the receive is there in time.
			if err := e.PostRecvs(1); err != nil {
				return err
			}
			wrs[0].ID = uint64(recvs)
			if _, err := e.QP.PostSend(wrs); err != nil {
				return fmt.Errorf("post echo #%d: %w", recvs, err)
			}
			recvs++
		}
	}
	return nil
}

// Sink is the server half of the SEND bandwidth test: consume total
// receives, reposting each so the sender rarely meets an empty queue.
func (e *Endpoint) Sink(p *Poller, total int) error {
	got := 0
	for got < total {
		wcs, err := p.Next()
		if err != nil {
			return fmt.Errorf("receive after %d of %d: %w", got, total, err)
		}
		n := 0
		for k := range wcs {
			if wcs[k].Status != verbs.Success {
				return CheckWC(&wcs[k], fmt.Sprintf("receive #%d", got+n))
			}
			if wcs[k].ID == RecvID {
				n++
			}
		}
		if n > 0 {
			if err := e.PostRecvs(n); err != nil {
				return err
			}
			got += n
		}
	}
	return nil
}

// Stream keeps up to depth requests of s in flight until total have
// completed, signaling one in every cqMod (and the last). Completions are
// in order on RC, so a signaled completion retires every request before
// it; send queue slots are counted the same way, as hardware frees them.
// It returns the run's marks for perf.Bandwidth.
func (e *Endpoint) Stream(p *Poller, s Spec, total, depth, cqMod int) ([]perf.Mark, error) {
	base := e.WR(s)
	wrs := make([]verbs.SendWR, depth)
	marks := make([]perf.Mark, 1, total/cqMod+2)
	what := fmt.Sprintf("%s %d B", s.Op, s.Size)
	posted, done := 0, 0
	start := time.Now()
	for done < total {
		if room := min(depth-(posted-done), total-posted); room > 0 {
			batch := wrs[:room]
			for k := range batch {
				seq := posted + k
				batch[k] = base
				batch[k].ID = uint64(seq)
				if (seq+1)%cqMod == 0 || seq+1 == total {
					batch[k].Flags |= verbs.Signaled
				}
			}
			n, err := e.QP.PostSend(batch)
			posted += n
			if err != nil {
				return nil, fmt.Errorf("post %s #%d (%d in flight): %w", what, posted, posted-done, err)
			}
		}
		wcs, err := p.Next()
		if err != nil {
			return nil, fmt.Errorf("%s after %d of %d: %w", what, done, total, err)
		}
		for k := range wcs {
			wc := &wcs[k]
			if wc.Status != verbs.Success {
				return nil, CheckWC(wc, fmt.Sprintf("%s #%d", what, wc.ID))
			}
			if int(wc.ID) < done || int(wc.ID) >= posted {
				return nil, fmt.Errorf("%s: completion for request %d out of order (done %d, posted %d)", what, wc.ID, done, posted)
			}
			done = int(wc.ID) + 1
		}
		marks = append(marks, perf.Mark{At: time.Since(start), Msgs: done})
	}
	return marks, nil
}
