package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// batch is how many SQEs a submitter takes before it yields.
const batch = 32

// vq is a client's VQ: a core.Queue driven through the VQ's rings.
type vq struct {
	ss   *session
	id   uint64
	q    *core.Queue
	blk  *offheap.Block
	ring *wire.Ring
	door *wire.Bell // the client rings it: SQEs, or ring space freed
	cq   *wire.Bell // we ring it: completions
	msg  *wire.Bell // we ring it: messages
	ctl  *wire.Bell // we ring it: control SQEs' outcomes (cq if the client sent none)

	ctlFlag int // the header flag the client sleeps on for ctl

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	node     atomic.Uint64 // connected node, for status
	port     atomic.Uint32 // bound port, for status
	accepted atomic.Uint64 // requests pushed to q
	retired  uint64        // published Retired; completer only
	cqSpace  chan struct{} // the client freed completion ring space
	msgSpace chan struct{} // the client freed message ring space
	msgOnce  sync.Once
	failOnce sync.Once
}

func newVQ(ss *session, fds []int) (*vq, error) {
	size := wire.RingSize(ss.s.rt.MaxMessage())
	blk, err := offheap.OpenSealed(fds[0], size)
	if err != nil {
		return nil, fmt.Errorf("queue: ring: %w: %w", err, verbs.ErrInvalid)
	}
	ring, _ := wire.NewRing(blk.Bytes(), ss.s.rt.MaxMessage())
	q, err := ss.s.rt.Queue()
	if err != nil {
		blk.Close()
		return nil, err
	}
	v := &vq{ss: ss, id: ss.s.ids.Add(1), q: q, blk: blk, ring: ring, door: wire.BellFromFD(fds[1]),
		cq: wire.BellFromFD(fds[2]), msg: wire.BellFromFD(fds[3]),
		cqSpace: make(chan struct{}, 1), msgSpace: make(chan struct{}, 1)}
	// A client of the first protocol sent no control bell; its control
	// outcomes ring the completion bell, which it would sleep on.
	v.ctl, v.ctlFlag = v.cq, wire.ClientCQ
	if len(fds) > 4 {
		v.ctl, v.ctlFlag = wire.BellFromFD(fds[4]), wire.ClientCtl
	}
	v.ctx, v.cancel = context.WithCancel(ss.ctx)
	return v, nil
}

func (v *vq) start() {
	v.wg.Add(2)
	go v.submit()
	go v.complete()
}

func (v *vq) connect(ctx context.Context, node core.NodeID, opts []core.ConnectOption) error {
	if err := v.q.Connect(ctx, node, opts...); err != nil {
		return err
	}
	v.node.Store(node)
	return nil
}

func (v *vq) bind(port uint32) error {
	if err := v.q.Bind(port); err != nil {
		return err
	}
	v.port.Store(port)
	v.msgOnce.Do(func() {
		v.wg.Add(1)
		go v.deliver()
	})
	return nil
}

// fail stops a VQ whose client broke the ring protocol; only that VQ
// suffers.
func (v *vq) fail(why string) {
	v.failOnce.Do(func() {
		v.ss.refusals.Add(1)
		v.ss.s.log.Warn("VQ failed: client broke the ring protocol", "client", v.ss.id, "vq", v.id, "why", why)
		v.cancel()
	})
}

// close stops the VQ's goroutines and releases it. Requests in flight
// retire unseen.
func (v *vq) close() {
	v.cancel()
	v.wg.Wait()
	v.q.Close()
	v.door.Close()
	v.cq.Close()
	v.msg.Close()
	if v.ctl != v.cq {
		v.ctl.Close()
	}
	v.blk.Close()
}

func (v *vq) stopped() error { return v.ctx.Err() }

// submit consumes the submission ring until the VQ stops.
func (v *vq) submit() {
	defer v.wg.Done()
	r := v.ring
	tail, head := r.Ctr(wire.SQTail), r.Ctr(wire.SQHead)
	seq := head.Load()
	reqs := make([]core.Request, 0, batch)
	var err error
	ready := func() bool { return tail.Load() != seq || v.spaceFreed() }
	for {
		if err := wire.Wait(v.ctx, ready, r.Ctr(wire.DaemonSleeps), v.door, v.stopped); err != nil {
			return
		}
		avail := tail.Load() - seq
		if avail > wire.SQEntries {
			v.fail(fmt.Sprintf("submission tail %d entries ahead", avail))
			return
		}
		n := min(avail, batch)
		for i := uint64(0); i < n; i++ {
			e := r.GetSQE(seq + i)
			switch e.Op {
			case wire.OpRecv:
				v.postRecv(&e)
			case wire.OpConnectSQE:
				// requests before the connect go where the VQ pointed
				if reqs, err = v.push(reqs); err != nil {
					return
				}
				v.ringConnect(seq+i, &e)
			default:
				reqs = append(reqs, v.request(seq+i, &e))
			}
		}
		seq += n
		head.Store(seq) // the entries are copied: the client may reuse them
		if avail == wire.SQEntries {
			// Only a client that found the ring full waits for its space;
			// waking one that waits for a completion would only cost it
			// a spurious wake-up per push.
			wire.Notify(r.Ctr(wire.ClientCQ), v.cq)
		}
		if reqs, err = v.push(reqs); err != nil {
			return
		}
		runtime.Gosched() // one batch per turn: the other clients' turn
	}
}

// push hands the translated requests to the queue and returns reqs
// emptied for reuse.
func (v *vq) push(reqs []core.Request) ([]core.Request, error) {
	if len(reqs) == 0 {
		return reqs, nil
	}
	k, err := v.q.Push(v.ctx, true, reqs...)
	v.accepted.Add(uint64(k))
	v.ss.pushes.Add(uint64(k))
	clear(reqs)
	return reqs[:0], err
}

// ringConnect runs a Connect the client sent on the submission ring and
// publishes its outcome. The node and port are the client's, checked by
// the runtime as any caller's; a cold connect bounded by the call timeout
// holds up only this VQ.
func (v *vq) ringConnect(seq uint64, e *wire.SQE) {
	var opts []core.ConnectOption
	if e.Flags&wire.FlagToPort != 0 {
		opts = append(opts, core.ToPort(e.Imm))
	}
	ctx, cancel := context.WithTimeout(v.ctx, v.ss.s.cfg.CallTimeout)
	err := v.connect(ctx, e.MR, opts)
	cancel()
	v.ss.ringCalls.Add(1)
	if errors.Is(err, core.ErrRefused) || errors.Is(err, verbs.ErrInvalid) {
		v.ss.refusals.Add(1)
	}
	v.ring.Ctr(wire.CtlDone).Store(wire.CtlResult(seq, wire.ErrorCode(err)))
	wire.Notify(v.ring.Ctr(v.ctlFlag), v.ctl)
}

// spaceFreed wakes the completer or messenger when the client freed the
// ring space one of them waits for.
func (v *vq) spaceFreed() bool {
	woke := false
	for _, w := range [...]struct {
		flag int
		ch   chan struct{}
	}{{wire.DaemonFullCQ, v.cqSpace}, {wire.DaemonFullMsg, v.msgSpace}} {
		if v.ring.Ctr(w.flag).CompareAndSwap(1, 0) {
			select {
			case w.ch <- struct{}{}:
			default:
			}
			woke = true
		}
	}
	return woke
}

// request translates an SQE. An MR or region that is not the client's
// becomes a request the runtime refuses in order on this VQ.
func (v *vq) request(seq uint64, e *wire.SQE) core.Request {
	r := core.Request{ID: seq, Op: verbs.Opcode(e.Op), Imm: e.Imm, Compare: e.Compare, Swap: e.Swap,
		Unsignaled: e.Flags&wire.FlagUnsignaled != 0}
	off, n := toInt(e.Off), toInt(e.Len)
	if n != 0 {
		if mem := v.ss.mr(e.MR); mem != nil {
			r.Local = mem.mr.Range(off, n)
		} else {
			v.ss.refusals.Add(1)
			r.Local = core.Local{Off: off, Len: n} // no MR: refused
		}
	}
	if e.Region != 0 {
		if g := v.ss.regionByID(e.Region); g != nil {
			r.Remote = g.At(e.RemoteOff)
		} else {
			v.ss.refusals.Add(1) // no region: refused
		}
	}
	return r
}

func (v *vq) postRecv(e *wire.SQE) {
	mem := v.ss.mr(e.MR)
	if mem == nil {
		v.ss.refusals.Add(1)
		return
	}
	if err := v.q.PushRecv(mem.mr.Range(toInt(e.Off), toInt(e.Len))); err != nil {
		v.ss.refusals.Add(1)
	}
}

// toInt converts a client's offset or length; nonsense becomes -1, which
// the runtime refuses.
func toInt(x uint64) int {
	if x > math.MaxInt32*8 {
		return -1
	}
	return int(x)
}

// complete moves the queue's completions to the completion ring.
func (v *vq) complete() {
	defer v.wg.Done()
	r := v.ring
	tail, head := r.Ctr(wire.CQTail), r.Ctr(wire.CQHead)
	pos := tail.Load()
	out := make([]core.Completion, 64)
	for {
		free, ok := v.ringRoom("completion", pos, head, wire.CQEntries, wire.DaemonFullCQ, v.cqSpace)
		if !ok {
			return
		}
		n, err := v.q.PopWait(v.ctx, out[:min(int(free), len(out))])
		if err != nil {
			return
		}
		for i := range out[:n] {
			c := &out[i]
			r.PutCQE(pos, wire.CQE{Seq: c.ID, Status: c.Status, Len: uint32(c.Len)})
			pos++
		}
		tail.Store(pos)
		v.publishRetired()
		v.ss.completions.Add(uint64(n))
		wire.Notify(r.Ctr(wire.ClientCQ), v.cq)
	}
}

// publishRetired tells the client how many requests are finished, which its
// credits count against. Reading accepted before Outstanding can only
// undercount, so the client never overruns the queue's credits.
func (v *vq) publishRetired() {
	acc := v.accepted.Load()
	out := uint64(v.q.Outstanding())
	if acc >= out && acc-out > v.retired {
		v.retired = acc - out
		v.ring.Ctr(wire.Retired).Store(v.retired)
	}
}

// ringRoom reports how many entries a ring the daemon fills (completions
// or messages) has free at pos, waiting while it is full; ok is false once
// the client's head proved hostile (the VQ fails) or the VQ stopped.
func (v *vq) ringRoom(what string, pos uint64, head *atomic.Uint64, size uint64, flag int, space chan struct{}) (free uint64, ok bool) {
	for {
		used := pos - head.Load()
		switch {
		case used > size:
			v.fail(fmt.Sprintf("%s head %d entries off", what, used))
			return 0, false
		case used < size:
			return size - used, true
		}
		if !v.waitSpace(flag, space, func() bool { return pos-head.Load() < size }) {
			return 0, false
		}
	}
}

// waitSpace waits until the client frees ring space: it raises flag, which
// makes the client ring the doorbell, and the submitter wakes ch.
func (v *vq) waitSpace(flag int, ch chan struct{}, free func() bool) bool {
	v.ring.Ctr(flag).Store(1)
	if free() {
		return true
	}
	select {
	case <-ch:
		return true
	case <-v.ctx.Done():
		return false
	}
}

// deliver moves received messages to the message ring.
func (v *vq) deliver() {
	defer v.wg.Done()
	r := v.ring
	tail, head := r.Ctr(wire.MsgTail), r.Ctr(wire.MsgHead)
	pos := tail.Load()
	msgs := make([]core.Message, 16)
	for {
		free, ok := v.ringRoom("message", pos, head, wire.MsgEntries, wire.DaemonFullMsg, v.msgSpace)
		if !ok {
			return
		}
		n, err := v.q.PopMsgsWait(v.ctx, msgs[:min(int(free), len(msgs))])
		if err != nil {
			return
		}
		for i := range msgs[:n] {
			r.PutMsg(pos, msgHdr(&msgs[i]), msgs[i].Data)
			msgs[i] = core.Message{}
			pos++
		}
		tail.Store(pos)
		wire.Notify(r.Ctr(wire.ClientMsg), v.msg)
	}
}

func msgHdr(m *core.Message) wire.MsgHdr {
	h := wire.MsgHdr{Status: m.Status, Len: uint32(m.Len), Imm: m.Imm, From: m.From, Port: m.Port}
	if m.Buf != nil {
		h.Flags |= wire.MsgInBuf
	}
	if m.HasImm {
		h.Flags |= wire.MsgHasImm
	}
	return h
}
