package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// Bind makes the queue receive the messages sent to port on the daemon's
// node. A Bind or Unbind of the queue waits for the one before it to be
// answered, even one whose caller stopped waiting: a Bind that timed out
// and bound the port after all is unbound before the next call goes out,
// so its undoing cannot undo the next one.
func (v *VQ) Bind(port uint32) error {
	what := fmt.Sprintf("bind port %d", port)
	if v.shut.Load() { // the daemon forgot the VQ: it would refuse the id
		return fmt.Errorf("client: %s: %w", what, v.errClosed())
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.c.timeout)
	defer cancel()
	if err := v.bindTurn(ctx); err != nil {
		return wrap(what, err)
	}
	_, late, err := v.c.callLate(ctx, wire.NewMsg(wire.OpBind, 0).U64(v.id).U32(port), func(r *wire.Msg) {
		if r.Code == wire.CodeOK { // bound for a caller told it failed
			v.c.post(wire.NewMsg(wire.OpUnbind, 0).U64(v.id))
		}
		<-v.bindTok
	})
	if !late {
		<-v.bindTok
	}
	return wrap(what, err)
}

// bindTurn waits for the queue's Bind and Unbind calls before to be
// answered (bindTok); the caller gives the turn back.
func (v *VQ) bindTurn(ctx context.Context) error {
	select {
	case v.bindTok <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-v.c.done:
		return v.c.err()
	}
}

// Unbind stops the queue receiving; messages already received stay. A
// daemon gone has unbound it already.
func (v *VQ) Unbind() {
	ctx, cancel := context.WithTimeout(context.Background(), v.c.timeout)
	defer cancel()
	if v.bindTurn(ctx) != nil {
		return
	}
	v.c.call(ctx, wire.NewMsg(wire.OpUnbind, 0).U64(v.id)) // late, it still goes before the next Bind
	<-v.bindTok
}

// PushRecv posts buffers that messages to the bound port land in, in order.
func (v *VQ) PushRecv(bufs ...krcore.Local) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.shut.Load() {
		return fmt.Errorf("client: push receive: %w", v.errClosed())
	}
	if err := v.c.err(); err != nil {
		return err
	}
	for i, b := range bufs {
		if v.c.mrID(b.MR) == 0 || b.Len == 0 || !b.Fits(b.MR.Len()) || b.MR.Access()&verbs.AccessLocalWrite == 0 {
			return fmt.Errorf("client: push receive buffer %d: not inside a live MR of this client with LOCAL_WRITE: %w", i, verbs.ErrInvalid)
		}
	}
	if v.sqTail+uint64(len(bufs))-v.ring.Ctr(wire.SQHead).Load() > wire.SQEntries {
		v.publish()
		return fmt.Errorf("client: push %d receives: submission ring full: %w", len(bufs), krcore.ErrNoCredit)
	}
	for _, b := range bufs {
		v.ring.PutSQE(v.sqTail, &wire.SQE{Op: wire.OpRecv, MR: v.c.mrID(b.MR), Off: uint64(b.Off), Len: uint64(b.Len)})
		v.sqTail++
	}
	v.recvs = append(v.recvs, bufs...)
	v.publish()
	return nil
}

// PopMsgs moves received messages into out and returns how many. It never
// blocks.
func (v *VQ) PopMsgs(out []krcore.Message) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		k := copy(out, v.leftMsgs)
		v.leftMsgs = v.leftMsgs[k:]
		return k
	}
	return len(v.popMsgRing(out[:0], len(out)))
}

// popMsgRing appends up to max (-1: all) messages from the message ring to
// out and tells the daemon; v.mu held, the ring mapped.
func (v *VQ) popMsgRing(out []krcore.Message, max int) []krcore.Message {
	r := v.ring
	tail := r.Ctr(wire.MsgTail).Load()
	for len(out) != max && v.msgHead != tail {
		h, data := r.GetMsg(v.msgHead)
		m := krcore.Message{Len: int(h.Len), From: h.From, Port: h.Port, Imm: h.Imm,
			HasImm: h.Flags&wire.MsgHasImm != 0, Write: h.Flags&wire.MsgWrite != 0, Status: h.Status}
		switch {
		case m.Write: // no payload, no buffer taken
		case h.Flags&wire.MsgInBuf != 0 && len(v.recvs) > 0:
			buf := v.recvs[0]
			v.recvs = v.recvs[1:]
			m.Buf = &buf
		default:
			m.Data = append([]byte(nil), data...)
		}
		out = append(out, m)
		v.msgHead++
	}
	wire.Publish(r.Ctr(wire.MsgHead), v.msgHead)
	if r.Ctr(wire.DaemonFullMsg).Load() != 0 {
		v.door.Ring()
	}
	return out
}

// PopMsgsWait is PopMsgs that waits for at least one message. An empty
// out could never take one: it is refused at once (verbs.ErrInvalid).
func (v *VQ) PopMsgsWait(ctx context.Context, out []krcore.Message) (int, error) {
	if len(out) == 0 {
		return 0, fmt.Errorf("client: pop messages wait: no room for a message: %w", verbs.ErrInvalid)
	}
	for {
		if n := v.PopMsgs(out); n > 0 {
			return n, nil
		}
		if v.shut.Load() {
			return 0, v.errClosed()
		}
		if err := v.c.err(); err != nil {
			return 0, err
		}
		err := v.sleep(ctx, v.msgWait, v.msg, wire.ClientMsg, v.msgsOrAnyReady)
		if err != nil && v.c.err() == nil {
			return 0, err
		}
	}
}

// msgsOrAnyReady is PopMsgsWait's wake-up condition: a message, or a
// completion while a PopAnyWait caller waits (ClientAny). Such a caller
// queues for the message bell behind this one (one sleeper per bell), and
// the completion is its to pop: leaving the sleep hands it the bell, and
// this caller sleeps again behind it.
func (v *VQ) msgsOrAnyReady() bool {
	r := v.ring
	return r.Ctr(wire.MsgTail).Load() != r.Ctr(wire.MsgHead).Load() ||
		r.Ctr(wire.ClientAny).Load() != 0 && r.Ctr(wire.CQTail).Load() != r.Ctr(wire.CQHead).Load()
}

// PopAnyWait waits for at least one completion (into out) or message
// (into msgs) and pops what is ready of both. It sleeps on the message
// bell with ClientAny raised, which makes the daemon ring that bell for
// completions too, so one sleep serves both. An empty msgs makes it
// PopWait, an empty out PopMsgsWait; both empty is ErrInvalid.
func (v *VQ) PopAnyWait(ctx context.Context, out []krcore.Completion, msgs []krcore.Message) (nc, nm int, err error) {
	switch {
	case len(out) == 0 && len(msgs) == 0:
		return 0, 0, fmt.Errorf("client: pop any wait: no room for a completion or a message: %w", verbs.ErrInvalid)
	case len(msgs) == 0:
		nc, err = v.PopWait(ctx, out)
		return nc, 0, err
	case len(out) == 0:
		nm, err = v.PopMsgsWait(ctx, msgs)
		return 0, nm, err
	}
	for {
		if nc, nm = v.Pop(out), v.PopMsgs(msgs); nc+nm > 0 {
			return nc, nm, nil
		}
		if v.shut.Load() {
			return 0, 0, v.errClosed()
		}
		if err := v.c.err(); err != nil {
			return 0, 0, err
		}
		// Raised before the message bell's token is taken: a PopMsgsWait
		// holding it then wakes for completions too and lets this waiter
		// in (msgsOrAnyReady).
		v.countAny(1)
		err := v.sleepAny(ctx)
		v.countAny(^uint64(0))
		if err != nil && v.c.err() == nil {
			return 0, 0, err
		}
	}
}

// anySlice bounds a PopAnyWait's sleep on a daemon that does not ring the
// message bell for completions (no wire.FeatureClientAny): a completion
// then waits for the slice's end, not for the caller's context's.
const anySlice = time.Millisecond

// sleepAny is PopAnyWait's sleep on the message bell until a message or a
// completion is ready. It spins as a message's waiter does (VQ.spin: not
// at all after a publish that rang the doorbell), not as PopWait's: a
// PopAnyWait waits for an answer (an RPC's reply), which comes only after
// the woken pump and the fabric, and a spin for the request's own
// completion held the core the pump needed (MEASUREMENTS.md, "PopAnyWait
// through krcored").
func (v *VQ) sleepAny(ctx context.Context) error {
	ready := func() bool {
		r := v.ring
		return r.Ctr(wire.MsgTail).Load() != r.Ctr(wire.MsgHead).Load() ||
			r.Ctr(wire.CQTail).Load() != r.Ctr(wire.CQHead).Load()
	}
	if v.c.features&wire.FeatureClientAny != 0 {
		return v.sleep(ctx, v.msgWait, v.msg, wire.ClientMsg, ready)
	}
	sctx, cancel := context.WithTimeout(ctx, anySlice)
	defer cancel()
	err := v.sleep(sctx, v.msgWait, v.msg, wire.ClientMsg, ready)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil // the slice's end: look again
	}
	return err
}

// countAny adds d to ClientAny, the number of PopAnyWait callers that may
// sleep on the message bell (a count, not a flag: one waiter's leaving
// must not lower it under another), unless the queue was released.
func (v *VQ) countAny(d uint64) {
	v.live.RLock()
	defer v.live.RUnlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.closed {
		v.ring.Ctr(wire.ClientAny).Add(d) // a full barrier before the look, as Publish
	}
}
