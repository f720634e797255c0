package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

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

	// The pump's, under its lock:
	seq      uint64                // the next SQE to consume
	recvsTo  uint64                // receive SQEs before it are posted
	pos      uint64                // the next CQE to fill
	retired  uint64                // published Retired
	workedIn uint64                // the pump's last round that did work here
	stamps   [wire.SQEntries]stamp // when requests left the ring, see sent

	armedTail  atomic.Uint64 // the submission tail when the pump armed to sleep
	connecting atomic.Bool   // a Connect SQE runs; later SQEs wait
	msgSpace   chan struct{} // the client freed message ring space
	msgOnce    sync.Once
	failOnce   sync.Once
}

func newVQ(ss *session, fds []int) (*vq, error) {
	for _, fd := range fds[1:] {
		if err := wire.CheckEventfd(fd); err != nil {
			return nil, fmt.Errorf("queue: %w: %w", err, verbs.ErrInvalid)
		}
	}
	size := wire.RingSize(ss.s.rt.Config().MaxMessage)
	blk, err := offheap.OpenSealed(fds[0], size)
	if err != nil {
		return nil, fmt.Errorf("queue: ring: %w: %w", err, verbs.ErrInvalid)
	}
	fds[0] = -1 // the block's now, closed with it (see mapAndRegister)
	ring, _ := wire.NewRing(blk.Bytes(), ss.s.rt.Config().MaxMessage)
	q, err := ss.s.rt.Queue()
	if err != nil {
		blk.Close()
		return nil, err
	}
	v := &vq{ss: ss, id: ss.s.ids.Add(1), q: q, blk: blk, ring: ring, door: wire.BellFromFD(fds[1]),
		cq: wire.BellFromFD(fds[2]), msg: wire.BellFromFD(fds[3]),
		msgSpace: make(chan struct{}, 1)}
	v.seq, v.pos = ring.Ctr(wire.SQHead).Load(), ring.Ctr(wire.CQTail).Load()
	v.recvsTo = v.seq
	// A client of the first protocol sent no control bell; its control
	// outcomes ring the completion bell, which it would sleep on.
	v.ctl, v.ctlFlag = v.cq, wire.ClientCQ
	if len(fds) > 4 {
		v.ctl, v.ctlFlag = wire.BellFromFD(fds[4]), wire.ClientCtl
	}
	v.ctx, v.cancel = context.WithCancel(ss.ctx)
	return v, nil
}

// start has the client's pump serve v and watches v's doorbell.
func (v *vq) start() {
	v.wg.Add(1)
	go v.watchDoor(v.ss.pump)
	v.ss.pump.add(v)
}

func (v *vq) connect(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions) error {
	start := time.Now()
	err := v.q.Connect(ctx, node, opts)
	v.ss.s.metrics.observeConnect(start, err)
	if err != nil {
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
	v.ss.pump.remove(v)
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

// ringConnect runs a Connect the client sent on the submission ring and
// publishes its outcome. The node and port are the client's, checked by
// the runtime as any caller's; a cold connect bounded by the call timeout
// holds up only this VQ.
func (v *vq) ringConnect(seq uint64, e *wire.SQE) {
	var opts krcore.ConnectOptions
	if e.Flags&wire.FlagToPort != 0 {
		opts.Port = e.Imm
	}
	ctx, cancel := context.WithTimeout(v.ctx, v.ss.s.cfg.CallTimeout)
	err := v.connect(ctx, e.MR, &opts)
	cancel()
	v.ss.ringCalls.Add(1)
	if errors.Is(err, krcore.ErrRefused) || errors.Is(err, verbs.ErrInvalid) {
		v.ss.refusals.Add(1)
	}
	v.ring.PutCtlErr(err)
	wire.Publish(v.ring.Ctr(wire.CtlDone), wire.CtlResult(seq, wire.ErrorCode(err)))
	wire.Notify(v.ring.Ctr(v.ctlFlag), v.ctl)
}

// request translates an SQE. An MR or region that is not the client's
// becomes a request the runtime refuses in order on this VQ.
func (v *vq) request(seq uint64, e *wire.SQE) krcore.Request {
	r := krcore.Request{ID: seq, Op: verbs.Opcode(e.Op), Imm: e.Imm, Compare: e.Compare, Swap: e.Swap,
		Unsignaled: e.Flags&wire.FlagUnsignaled != 0}
	off, n := toInt(e.Off), toInt(e.Len)
	if n != 0 {
		if mem := v.ss.mr(e.MR); mem != nil {
			r.Local = mem.mr.Range(off, n)
		} else {
			v.ss.refusals.Add(1)
			r.Local = krcore.Local{Off: off, Len: n} // no MR: refused
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

// toInt converts a client's offset or length back to the int it pushed
// (the SQE carries its two's complement), so that the runtime refuses a
// bad one as it would the embedded caller's: a negative one as negative, a
// huge one as past the MR. Beyond int's range (a 32-bit daemon) it
// saturates.
func toInt(x uint64) int {
	switch v := int64(x); {
	case v > math.MaxInt:
		return math.MaxInt
	case v < math.MinInt:
		return math.MinInt
	default:
		return int(v)
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
		wire.Publish(v.ring.Ctr(wire.Retired), v.retired)
	}
}

// notifyAny rings the message bell for completions just published when a
// PopAnyWait caller (ClientAny, a count) may sleep there and the client
// sleeps on it (ClientMsg): a caller still polling needs no system call,
// nor the spurious wake-up its next sleep would take from the bell's
// count. The flag is loaded first: the caller raises the count before the
// flag and loads the completion tail after it, so a daemon that sees the
// flag it must answer sees the count too.
func (v *vq) notifyAny() {
	r := v.ring
	if r.Ctr(wire.ClientMsg).Load() != 0 && r.Ctr(wire.ClientAny).Load() != 0 {
		v.msg.Ring()
	}
}

// msgRoom reports how many entries the message ring has free at pos,
// waiting while it is full; ok is false once the client's head proved
// hostile (the VQ fails) or the VQ stopped.
func (v *vq) msgRoom(pos uint64) (free uint64, ok bool) {
	head := v.ring.Ctr(wire.MsgHead)
	for {
		used := pos - head.Load()
		switch {
		case used > wire.MsgEntries:
			v.fail(fmt.Sprintf("message head %d entries off", used))
			return 0, false
		case used < wire.MsgEntries:
			return wire.MsgEntries - used, true
		}
		// The raised flag makes the client ring the doorbell when it
		// frees space, and watchDoor passes it on.
		wire.Publish(v.ring.Ctr(wire.DaemonFullMsg), 1)
		if pos-head.Load() < wire.MsgEntries {
			continue
		}
		select {
		case <-v.msgSpace:
		case <-v.ctx.Done():
			return 0, false
		}
	}
}

// deliver moves received messages to the message ring.
func (v *vq) deliver() {
	defer v.wg.Done()
	r := v.ring
	tail := r.Ctr(wire.MsgTail)
	pos := tail.Load()
	msgs := make([]krcore.Message, 16)
	for {
		free, ok := v.msgRoom(pos)
		if !ok {
			return
		}
		n, err := v.q.PopMsgsWait(v.ctx, msgs[:min(int(free), len(msgs))])
		if err != nil {
			return
		}
		for i := range msgs[:n] {
			r.PutMsg(pos, msgHdr(&msgs[i]), msgs[i].Data)
			msgs[i] = krcore.Message{}
			pos++
		}
		wire.Publish(tail, pos)
		wire.Notify(r.Ctr(wire.ClientMsg), v.msg)
	}
}

func msgHdr(m *krcore.Message) wire.MsgHdr {
	h := wire.MsgHdr{Status: m.Status, Len: uint32(m.Len), Imm: m.Imm, From: m.From, Port: m.Port}
	if m.Buf != nil {
		h.Flags |= wire.MsgInBuf
	}
	if m.HasImm {
		h.Flags |= wire.MsgHasImm
	}
	if m.Write {
		h.Flags |= wire.MsgWrite
	}
	return h
}
