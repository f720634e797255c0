package bench

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

// endpoint is one side's verbs objects for a test, what perftest calls its
// context: a PD, one CQ for sends and receives, an RC QP and an MR over an
// off-heap buffer.
type endpoint struct {
	pd     verbs.PD
	cq     verbs.CQ
	qp     verbs.QP
	mr     verbs.MR
	buf    *offheap.Block
	ownBuf bool
	inline int // payloads up to this size are posted inline

	recvWRs []verbs.RecvWR // reused by postRecvs
}

// qpShape sizes an endpoint's queues.
type qpShape struct {
	sendDepth, recvDepth, inline int
}

// allocBuf maps an off-heap buffer of at least size bytes (and at least 8,
// for atomics). The size is rounded up to whole pages: offheap.Block.Close
// panics on a block whose length is not a page multiple (it reslices past
// the block's capacity), and the memory is mapped by the page anyway.
func allocBuf(size int) (*offheap.Block, error) {
	page := os.Getpagesize()
	b, err := offheap.Alloc((max(size, 8) + page - 1) / page * page)
	if err != nil {
		return nil, fmt.Errorf("allocate %d B buffer: %w", size, err)
	}
	return b, nil
}

// newEndpoint creates PD, CQ, QP and MR on dev. buf, if not nil, is
// registered instead of a new buffer of size bytes and stays the caller's.
func newEndpoint(dev verbs.Device, buf *offheap.Block, size int, sh qpShape) (_ *endpoint, err error) {
	e := &endpoint{buf: buf}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.buf == nil {
		if e.buf, err = allocBuf(size); err != nil {
			return nil, err
		}
		e.ownBuf = true
	}
	attr := dev.Attr()
	if sh.sendDepth > attr.MaxQPWR || sh.recvDepth > attr.MaxQPWR {
		return nil, fmt.Errorf("queue depth %d/%d exceeds the device's %d: %w", sh.sendDepth, sh.recvDepth, attr.MaxQPWR, verbs.ErrLimit)
	}
	e.inline = min(sh.inline, attr.MaxInline)
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	if e.cq, err = dev.CreateCQ(sh.sendDepth + sh.recvDepth + 16); err != nil {
		return nil, fmt.Errorf("create CQ: %w", err)
	}
	e.qp, err = e.pd.CreateQP(verbs.QPInit{
		Type: verbs.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: sh.sendDepth, MaxRecvWR: max(sh.recvDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: max(e.inline, 0)},
	})
	if err != nil {
		return nil, fmt.Errorf("create RC QP: %w", err)
	}
	if e.mr, err = e.pd.RegMR(e.buf.Bytes(), verbs.AccessAll); err != nil {
		return nil, fmt.Errorf("register %d B MR: %w", e.buf.Len(), err)
	}
	return e, nil
}

// info is what the peer needs to reach e's MR.
func (e *endpoint) info() *control.MR {
	return &control.MR{Addr: e.mr.Addr(), RKey: e.mr.RKey(), Len: e.mr.Len()}
}

// connect brings e's QP to RTS towards the peer QP at remote.
func (e *endpoint) connect(remote verbs.Endpoint) error {
	return verbs.Connect(e.qp, remote, verbs.Path{})
}

// close destroys everything in reverse order of creation, reporting every
// failure: a leak here would skew the next test.
func (e *endpoint) close() error {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
	}
	if e.mr != nil {
		errs = append(errs, e.mr.Close())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	if e.ownBuf && e.buf != nil {
		errs = append(errs, e.buf.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release verbs objects: %w", err)
	}
	return nil
}

// postRecvs posts n receives of the whole MR. Every receive names the same
// bytes: a benchmark does not look at the data, as in perftest. The request
// slice is built once and reused, so the latency loops do not allocate.
func (e *endpoint) postRecvs(n int) error {
	if len(e.recvWRs) < n {
		sge := []verbs.SGE{verbs.SGEOf(e.mr, 0, e.mr.Len())}
		e.recvWRs = make([]verbs.RecvWR, n)
		for i := range e.recvWRs {
			e.recvWRs[i] = verbs.RecvWR{ID: recvID, SGL: sge}
		}
	}
	if k, err := e.qp.PostRecv(e.recvWRs[:n]); err != nil {
		return fmt.Errorf("post receive %d of %d: %w", k+1, n, err)
	}
	return nil
}

// recvID marks receive completions; send work requests count from 0.
const recvID = ^uint64(0)

// spinYield is how many empty polls pass between yields to the scheduler.
const spinYield = 16

// errNoCompletion reports a wait that outlived the timeout.
var errNoCompletion = errors.New("no completion before the deadline (is the peer alive?)")

// opSpec is one kind of request a test repeats.
type opSpec struct {
	op     verbs.Opcode
	size   int
	remote control.MR // one-sided ops: the peer's MR
	cmp    uint64     // atomics
	swap   uint64
}

// wr builds the request for s from e's MR at offset 0.
func (e *endpoint) wr(s opSpec) verbs.SendWR {
	w := verbs.SendWR{Op: s.op, SGL: []verbs.SGE{verbs.SGEOf(e.mr, 0, s.size)}}
	if s.op != verbs.OpSend && s.op != verbs.OpSendImm {
		w.RemoteAddr, w.RKey = s.remote.Addr, s.remote.RKey
	}
	if s.op.IsAtomic() {
		w.CompareAdd, w.Swap = s.cmp, s.swap
	}
	if (s.op == verbs.OpSend || s.op == verbs.OpWrite) && s.size <= e.inline {
		w.Flags |= verbs.Inline
	}
	return w
}

// latency runs warmup+iters one-sided requests one at a time, each
// signaled, and returns the iters measured post-to-completion times.
func (e *endpoint) latency(p *poller, s opSpec, warmup, iters int) ([]time.Duration, error) {
	wrs := []verbs.SendWR{e.wr(s)}
	wrs[0].Flags |= verbs.Signaled
	// Built only on failure: formatting would cost more than an in-memory
	// READ, and the connect test times this call.
	what := func(i int) string { return fmt.Sprintf("%s %d B #%d", s.op, s.size, i) }
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		wrs[0].ID = uint64(i)
		t0 := time.Now()
		if _, err := e.qp.PostSend(wrs); err != nil {
			return nil, fmt.Errorf("post %s: %w", what(i), err)
		}
		wcs, err := p.next()
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

// pingPong is the client half of the SEND latency test: send, wait for the
// server's echo, repeat. Receives must be posted already. It returns the
// measured round trips.
func (e *endpoint) pingPong(p *poller, size, warmup, iters int) ([]time.Duration, error) {
	return e.pingPongOp(p, opSpec{op: verbs.OpSend, size: size}, warmup, iters)
}

// pingPongOp is pingPong with s's request, any that consumes a receive at
// the peer (SEND, or WRITE_WITH_IMM into the peer's MR at s.remote).
func (e *endpoint) pingPongOp(p *poller, s opSpec, warmup, iters int) ([]time.Duration, error) {
	size := s.size
	wrs := []verbs.SendWR{e.wr(s)}
	wrs[0].Flags |= verbs.Signaled
	samples := make([]time.Duration, 0, iters)
	sendsDone := 0
	for i := range warmup + iters {
		wrs[0].ID = uint64(i)
		t0 := time.Now()
		if _, err := e.qp.PostSend(wrs); err != nil {
			return nil, fmt.Errorf("post %s %d B #%d: %w", s.op, size, i, err)
		}
		var rtt time.Duration
		got := false
		// Wait for the echo and for our own SEND's completion, whichever
		// comes first; the round trip ends at the echo.
		for !got || sendsDone <= i {
			wcs, err := p.next()
			now := time.Now()
			if err != nil {
				return nil, fmt.Errorf("%s ping-pong %d B #%d: %w", s.op, size, i, err)
			}
			for k := range wcs {
				wc := &wcs[k]
				if err := checkWC(wc, fmt.Sprintf("%s ping-pong %d B #%d", s.op, size, i)); err != nil {
					return nil, err
				}
				if wc.ID != recvID {
					sendsDone++
					continue
				}
				if got {
					return nil, fmt.Errorf("%s ping-pong #%d: two echoes for one request", s.op, i)
				}
				got, rtt = true, now.Sub(t0)
				if err := e.postRecvs(1); err != nil {
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

// echo is the server half of the SEND latency test: answer each of total
// receives with a SEND of size bytes.
func (e *endpoint) echo(p *poller, size, total int) error {
	return e.echoOp(p, opSpec{op: verbs.OpSend, size: size}, total)
}

// echoOp is echo answering with s's request (see pingPongOp).
func (e *endpoint) echoOp(p *poller, s opSpec, total int) error {
	size := s.size
	wrs := []verbs.SendWR{e.wr(s)}
	wrs[0].Flags |= verbs.Signaled
	recvs, sends := 0, 0
	for recvs < total || sends < recvs {
		wcs, err := p.next()
		if err != nil {
			return fmt.Errorf("echo %d B after %d of %d: %w", size, recvs, total, err)
		}
		for k := range wcs {
			wc := &wcs[k]
			if err := checkWC(wc, fmt.Sprintf("echo %d B #%d", size, recvs)); err != nil {
				return err
			}
			if wc.ID != recvID {
				sends++
				continue
			}
			// Repost before answering: the client's next SEND can only
			// come after our answer, so the receive is there in time.
			if err := e.postRecvs(1); err != nil {
				return err
			}
			wrs[0].ID = uint64(recvs)
			if _, err := e.qp.PostSend(wrs); err != nil {
				return fmt.Errorf("post echo #%d: %w", recvs, err)
			}
			recvs++
		}
	}
	return nil
}

// sink is the server half of the SEND bandwidth test: consume total
// receives, reposting each so the sender rarely meets an empty queue.
func (e *endpoint) sink(p *poller, total int) error {
	got := 0
	for got < total {
		wcs, err := p.next()
		if err != nil {
			return fmt.Errorf("receive after %d of %d: %w", got, total, err)
		}
		n := 0
		for k := range wcs {
			if err := checkWC(&wcs[k], fmt.Sprintf("receive #%d", got+n)); err != nil {
				return err
			}
			if wcs[k].ID == recvID {
				n++
			}
		}
		if n > 0 {
			if err := e.postRecvs(n); err != nil {
				return err
			}
			got += n
		}
	}
	return nil
}

// stream keeps up to depth requests of s in flight until total have
// completed, signaling one in every cqMod (and the last). Completions are
// in order on RC, so a signaled completion retires every request before
// it; send queue slots are counted the same way, as hardware frees them.
// It returns the run's marks for perf.Bandwidth.
func (e *endpoint) stream(p *poller, s opSpec, total, depth, cqMod int) ([]perf.Mark, error) {
	base := e.wr(s)
	wrs := make([]verbs.SendWR, depth)
	marks := make([]perf.Mark, 1, total/cqMod+2)
	what := fmt.Sprintf("%s %d B", s.op, s.size)
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
			n, err := e.qp.PostSend(batch)
			posted += n
			if err != nil {
				return nil, fmt.Errorf("post %s #%d (%d in flight): %w", what, posted, posted-done, err)
			}
		}
		wcs, err := p.next()
		if err != nil {
			return nil, fmt.Errorf("%s after %d of %d: %w", what, done, total, err)
		}
		for k := range wcs {
			wc := &wcs[k]
			if err := checkWC(wc, fmt.Sprintf("%s #%d", what, wc.ID)); err != nil {
				return nil, err
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
