package vqrun

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/verbs"
)

// Echo answers every message to its bound port with the same bytes, sent
// back to the sender's port through the same VQ.
type Echo struct {
	rt    krcore.API
	poll  Poll
	q     krcore.VQ
	in    krcore.MR // EchoSlots receive buffers of MaxMessage
	out   krcore.MR // the echo's source
	to    krcore.NodeID
	toPrt uint32
	msgs  []krcore.Message
	comp  []krcore.Completion
	// recv posts a message's buffer back: a kept one-slot slice, as a
	// raw QP's loop keeps its work request. PushRecv(buf) through the
	// krcore.VQ interface builds its variadic slice on the heap per call
	// (the compiler cannot see the callee keeps none).
	recv [1]krcore.Local
}

// NewEcho binds a queue of rt to port and posts its receive buffers.
func NewEcho(rt krcore.API, port uint32, poll Poll) (_ *Echo, err error) {
	e := &Echo{rt: rt, poll: poll, msgs: make([]krcore.Message, EchoSlots), comp: make([]krcore.Completion, 1)}
	defer func() {
		if err != nil {
			e.Close()
			err = fmt.Errorf("VQ echo on port %d: %w", port, err)
		}
	}()
	if e.q, err = rt.Queue(); err != nil {
		return nil, err
	}
	if err = e.q.Bind(port); err != nil {
		return nil, err
	}
	if e.in, e.out, err = Buffers(rt, e.q); err != nil {
		return nil, err
	}
	return e, nil
}

// Close closes the echo's queue and deregisters its buffers.
func (e *Echo) Close() error {
	return CloseVQ(e.rt, e.q, e.in, e.out)
}

// Buffers registers the buffers of a bound VQ, EchoSlots receive
// buffers of MaxMessage and one to send from, and posts every receive.
// It returns what it registered even when it fails, for CloseVQ.
func Buffers(rt krcore.API, q krcore.VQ) (in, out krcore.MR, err error) {
	if in, err = rt.RegMR(EchoSlots*MaxMessage, verbs.AccessLocalWrite); err != nil {
		return in, out, err
	}
	if out, err = rt.RegMR(MaxMessage, verbs.AccessLocalWrite); err != nil {
		return in, out, err
	}
	for i := range EchoSlots {
		if err = q.PushRecv(in.Range(i*MaxMessage, MaxMessage)); err != nil {
			return in, out, err
		}
	}
	return in, out, nil
}

// CloseVQ closes a queue (if any) and deregisters its buffers.
func CloseVQ(rt krcore.API, q krcore.VQ, mrs ...krcore.MR) error {
	if q != nil {
		q.Close()
	}
	var errs []error
	for _, m := range mrs {
		if m != nil {
			errs = append(errs, rt.Deregister(m))
		}
	}
	return errors.Join(errs...)
}

// Serve echoes total messages, each waits at most timeout.
func (e *Echo) Serve(ctx context.Context, total int, timeout time.Duration) error {
	dl := rawqp.NewDeadline(ctx, timeout)
	defer dl.Close()
	for done := 0; done < total; {
		n, err := e.poll.PopMsgs(dl.Get(), e.q, e.msgs)
		if err != nil {
			return fmt.Errorf("VQ echo: wait for message %d of %d: %w", done+1, total, err)
		}
		for i := range e.msgs[:n] {
			m := &e.msgs[i]
			if err := e.answer(dl.Get(), m); err != nil {
				return fmt.Errorf("VQ echo #%d: %w", done, err)
			}
			*m = krcore.Message{}
			done++
		}
	}
	return nil
}

func (e *Echo) answer(ctx context.Context, m *krcore.Message) error {
	if m.Status != verbs.Success {
		return fmt.Errorf("message from node %d: %s", m.From, m.Status)
	}
	if m.Port == 0 {
		return fmt.Errorf("message from node %d comes from no port: nowhere to answer", m.From)
	}
	data := m.Data
	if m.Buf != nil {
		data = m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
	}
	n := copy(e.out.Bytes(), data)
	if m.Buf != nil {
		e.recv[0] = *m.Buf
		err := e.q.PushRecv(e.recv[:]...)
		e.recv[0] = krcore.Local{}
		if err != nil {
			return err
		}
	}
	if m.From != e.to || m.Port != e.toPrt {
		if err := e.q.Connect(ctx, m.From, &krcore.ConnectOptions{Port: m.Port}); err != nil {
			return err
		}
		e.to, e.toPrt = m.From, m.Port
	}
	if err := e.q.PushOne(ctx, true, krcore.Request{Op: verbs.OpSend, Local: e.out.Range(0, n)}); err != nil {
		return err
	}
	if _, err := e.poll.Pop(ctx, e.q, e.comp); err != nil {
		return err
	}
	return e.comp[0].Err()
}

// Ping is the client half of a VQ ping-pong: a queue bound to a port and
// connected to the echo's, with receive buffers posted.
type Ping struct {
	rt   krcore.API
	poll Poll
	q    krcore.VQ
	in   krcore.MR
	out  krcore.MR
	msgs []krcore.Message
	comp []krcore.Completion
	seq  uint64
	recv [1]krcore.Local // see Echo.recv
}

// NewPing binds a queue of rt to port, connects it to node to, port
// toPort (an Echo's), and posts its receive buffers.
func NewPing(ctx context.Context, rt krcore.API, port uint32, to krcore.NodeID, toPort uint32, poll Poll) (_ *Ping, err error) {
	v := &Ping{rt: rt, poll: poll, msgs: make([]krcore.Message, 1), comp: make([]krcore.Completion, 1)}
	defer func() {
		if err != nil {
			v.Close()
			err = fmt.Errorf("VQ ping-pong to node %d port %d: %w", to, toPort, err)
		}
	}()
	if v.q, err = rt.Queue(); err != nil {
		return nil, err
	}
	if err = v.q.Bind(port); err != nil {
		return nil, err
	}
	if err = v.q.Connect(ctx, to, &krcore.ConnectOptions{Port: toPort}); err != nil {
		return nil, err
	}
	if v.in, v.out, err = Buffers(rt, v.q); err != nil {
		return nil, err
	}
	return v, nil
}

// Close closes the ping's queue and deregisters its buffers.
func (v *Ping) Close() error { return CloseVQ(v.rt, v.q, v.in, v.out) }

// Run does warmup+iters round trips of size bytes (at least 8: each
// message carries a sequence number the echo must return) and returns the
// last iters round trips, send to echo.
func (v *Ping) Run(ctx context.Context, size, warmup, iters int, timeout time.Duration) ([]time.Duration, error) {
	if size < 8 || size > MaxMessage {
		return nil, fmt.Errorf("VQ ping-pong: size %d B, want 8..%d", size, MaxMessage)
	}
	dl := rawqp.NewDeadline(ctx, timeout)
	defer dl.Close()
	samples := make([]time.Duration, 0, iters)
	ob := v.out.Bytes()
	for i := range warmup + iters {
		v.seq++
		binary.LittleEndian.PutUint64(ob, v.seq)
		wctx := dl.Get()
		t0 := time.Now()
		if err := v.q.PushOne(wctx, false, krcore.Request{ID: v.seq, Op: verbs.OpSend, Local: v.out.Range(0, size)}); err != nil {
			return nil, fmt.Errorf("VQ SEND %d B #%d: %w", size, i, err)
		}
		if _, err := v.poll.PopMsgs(wctx, v.q, v.msgs); err != nil {
			return nil, fmt.Errorf("VQ ping-pong %d B #%d: wait for the echo: %w", size, i, err)
		}
		rtt := time.Since(t0)
		m := &v.msgs[0]
		data := m.Data
		if m.Buf != nil {
			data = m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
		}
		if m.Status != verbs.Success || m.Len != size || binary.LittleEndian.Uint64(data) != v.seq {
			return nil, fmt.Errorf("VQ ping-pong #%d: echo of %d B with status %s does not carry sequence %d", i, m.Len, m.Status, v.seq)
		}
		if m.Buf != nil {
			v.recv[0] = *m.Buf
			err := v.q.PushRecv(v.recv[:]...)
			v.recv[0] = krcore.Local{}
			if err != nil {
				return nil, err
			}
		}
		*m = krcore.Message{}
		if _, err := v.poll.Pop(wctx, v.q, v.comp); err != nil {
			return nil, fmt.Errorf("VQ SEND %d B #%d: completion: %w", size, i, err)
		}
		if err := v.comp[0].Err(); err != nil {
			return nil, err
		}
		if i >= warmup {
			samples = append(samples, rtt)
		}
	}
	return samples, nil
}

// EchoSlots is how many receive buffers a ping-pong port keeps posted.
const EchoSlots = 16

// MaxMessage is the largest two-sided message krbench sends through a VQ:
// the runtime's default MaxMessage.
const MaxMessage = 4096
