package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// The KRCore side of a session. The server runs one runtime on its soft
// RNIC, with the MetaServer embedded; each client test starts a runtime of
// its own under a fresh node id that joins it (so no runtime ever meets a
// stale record of an earlier one) and closes it when the test ends.
const (
	serverNode      core.NodeID = 1
	firstClientNode             = 2
	// regionName is the region the server exports for one-sided tests.
	regionName = "krbench"
	regionSize = 64 << 10
	// echoPort is the server's two-sided port; clientPort the client's.
	echoPort   uint32 = 7
	clientPort uint32 = 8
	// echoSlots is how many receive buffers a ping-pong port keeps posted.
	echoSlots = 16
	// maxVQMessage is the largest two-sided message krbench sends through a
	// VQ: the runtime's default MaxMessage.
	maxVQMessage = 4096
)

// runVQEcho is the Test of an opRun that has the server echo messages on
// its VQ port (the raw SEND echo is Test "send").
const runVQEcho = "vq-echo"

// slogTo makes the runtimes' logger: warnings and errors, as text, to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// logfWriter adapts a logf function to an io.Writer, one call per line.
type logfWriter func(string, ...any)

func (f logfWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		f("%s", line)
	}
	return len(p), nil
}

// krServer is the server's runtime and what it offers clients.
type krServer struct {
	rt   *core.Runtime
	mem  *core.MR // exported as regionName
	echo *vqEcho
	dev  verbs.Device // the device it owns: only a kept runtime's (-keep-runtime)
	// nextClient is the node id the next client runtime takes.
	nextClient core.NodeID
}

// keepKrServer starts the runtime -keep-runtime keeps for every session,
// on a device of its own that outlives the sessions' devices.
func keepKrServer(ctx context.Context, cfg *config, fab fabric, log *slog.Logger) (*krServer, error) {
	if t, ok := fab.(tcpFabric); ok {
		// The sessions' soft nodes listen on -fabric-addr; this one takes
		// a port of its own on the same host.
		host, _, err := net.SplitHostPort(t.listen)
		if err != nil {
			return nil, fmt.Errorf("-fabric-addr %q: %w", t.listen, err)
		}
		fab = tcpFabric{listen: net.JoinHostPort(host, "0")}
	}
	dev, err := fab.newNode("kept runtime")
	if err != nil {
		return nil, err
	}
	k, err := startKrServer(ctx, dev, log, cfg.timeout, newVQPoll(cfg, fab.placement()))
	if err != nil {
		dev.Close()
		return nil, err
	}
	k.dev = dev
	return k, nil
}

// clientNode hands out the node id of a client runtime.
func (k *krServer) clientNode() core.NodeID {
	id := k.nextClient
	k.nextClient++
	return id
}

func startKrServer(ctx context.Context, dev verbs.Device, log *slog.Logger, timeout time.Duration, poll vqPoll) (_ *krServer, err error) {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rt, err := core.New(sctx, core.Config{Device: dev, Node: serverNode, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("start KRCore runtime: %w", err)
	}
	k := &krServer{rt: rt, nextClient: firstClientNode}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	if k.mem, err = rt.RegMR(regionSize, verbs.AccessAll); err != nil {
		return nil, fmt.Errorf("runtime region: %w", err)
	}
	if err = rt.Export(regionName, k.mem, 0, regionSize, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		return nil, fmt.Errorf("export runtime region: %w", err)
	}
	if k.echo, err = newVQEcho(core.Embed(rt), echoPort, poll); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *krServer) close() error {
	var errs []error
	if k.echo != nil {
		errs = append(errs, k.echo.close())
	}
	if k.mem != nil {
		errs = append(errs, k.rt.Deregister(k.mem))
	}
	if k.rt != nil {
		errs = append(errs, k.rt.Close())
	}
	if k.dev != nil {
		errs = append(errs, k.dev.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close KRCore runtime: %w", err)
	}
	return nil
}

// vqEcho answers every message to its bound port with the same bytes, sent
// back to the sender's port through the same VQ.
type vqEcho struct {
	rt    core.API
	poll  vqPoll
	q     core.VQ
	in    *core.MR // echoSlots receive buffers of maxVQMessage
	out   *core.MR // the echo's source
	to    core.NodeID
	toPrt uint32
	msgs  []core.Message
	comp  []core.Completion
}

func newVQEcho(rt core.API, port uint32, poll vqPoll) (_ *vqEcho, err error) {
	e := &vqEcho{rt: rt, poll: poll, msgs: make([]core.Message, echoSlots), comp: make([]core.Completion, 1)}
	defer func() {
		if err != nil {
			e.close()
			err = fmt.Errorf("VQ echo on port %d: %w", port, err)
		}
	}()
	if e.q, err = rt.Queue(); err != nil {
		return nil, err
	}
	if err = e.q.Bind(port); err != nil {
		return nil, err
	}
	if e.in, e.out, err = vqBuffers(rt, e.q); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *vqEcho) close() error {
	return closeVQ(e.rt, e.q, e.in, e.out)
}

// vqBuffers registers the buffers of a bound VQ, echoSlots receive
// buffers of maxVQMessage and one to send from, and posts every receive.
// It returns what it registered even when it fails, for closeVQ.
func vqBuffers(rt core.API, q core.VQ) (in, out *core.MR, err error) {
	if in, err = rt.RegMR(echoSlots*maxVQMessage, verbs.AccessLocalWrite); err != nil {
		return in, out, err
	}
	if out, err = rt.RegMR(maxVQMessage, verbs.AccessLocalWrite); err != nil {
		return in, out, err
	}
	for i := range echoSlots {
		if err = q.PushRecv(in.Range(i*maxVQMessage, maxVQMessage)); err != nil {
			return in, out, err
		}
	}
	return in, out, nil
}

// closeVQ closes a queue (if any) and deregisters its buffers.
func closeVQ(rt core.API, q core.VQ, mrs ...*core.MR) error {
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

// serve echoes total messages, each waits at most timeout.
func (e *vqEcho) serve(ctx context.Context, total int, timeout time.Duration) error {
	dl := newDeadline(ctx, timeout)
	defer dl.close()
	for done := 0; done < total; {
		n, err := e.poll.popMsgs(dl.get(), e.q, e.msgs)
		if err != nil {
			return fmt.Errorf("VQ echo: wait for message %d of %d: %w", done+1, total, err)
		}
		for i := range e.msgs[:n] {
			m := &e.msgs[i]
			if err := e.answer(dl.get(), m); err != nil {
				return fmt.Errorf("VQ echo #%d: %w", done, err)
			}
			*m = core.Message{}
			done++
		}
	}
	return nil
}

func (e *vqEcho) answer(ctx context.Context, m *core.Message) error {
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
		if err := e.q.PushRecv(*m.Buf); err != nil {
			return err
		}
	}
	if m.From != e.to || m.Port != e.toPrt {
		if err := e.q.Connect(ctx, m.From, core.ToPort(m.Port)); err != nil {
			return err
		}
		e.to, e.toPrt = m.From, m.Port
	}
	if _, err := e.q.Push(ctx, true, core.Request{Op: verbs.OpSend, Local: e.out.Range(0, n)}); err != nil {
		return err
	}
	if _, err := e.poll.pop(ctx, e.q, e.comp); err != nil {
		return err
	}
	return e.comp[0].Err()
}

// vqPing is the client half of a VQ ping-pong: a queue bound to a port and
// connected to the echo's, with receive buffers posted.
type vqPing struct {
	rt   core.API
	poll vqPoll
	q    core.VQ
	in   *core.MR
	out  *core.MR
	msgs []core.Message
	comp []core.Completion
	seq  uint64
}

func newVQPing(ctx context.Context, rt core.API, port uint32, to core.NodeID, toPort uint32, poll vqPoll) (_ *vqPing, err error) {
	v := &vqPing{rt: rt, poll: poll, msgs: make([]core.Message, 1), comp: make([]core.Completion, 1)}
	defer func() {
		if err != nil {
			v.close()
			err = fmt.Errorf("VQ ping-pong to node %d port %d: %w", to, toPort, err)
		}
	}()
	if v.q, err = rt.Queue(); err != nil {
		return nil, err
	}
	if err = v.q.Bind(port); err != nil {
		return nil, err
	}
	if err = v.q.Connect(ctx, to, core.ToPort(toPort)); err != nil {
		return nil, err
	}
	if v.in, v.out, err = vqBuffers(rt, v.q); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *vqPing) close() error { return closeVQ(v.rt, v.q, v.in, v.out) }

// run does warmup+iters round trips of size bytes (at least 8: each
// message carries a sequence number the echo must return) and returns the
// last iters round trips, send to echo.
func (v *vqPing) run(ctx context.Context, size, warmup, iters int, timeout time.Duration) ([]time.Duration, error) {
	if size < 8 || size > maxVQMessage {
		return nil, fmt.Errorf("VQ ping-pong: size %d B, want 8..%d", size, maxVQMessage)
	}
	dl := newDeadline(ctx, timeout)
	defer dl.close()
	samples := make([]time.Duration, 0, iters)
	ob := v.out.Bytes()
	for i := range warmup + iters {
		v.seq++
		binary.LittleEndian.PutUint64(ob, v.seq)
		wctx := dl.get()
		t0 := time.Now()
		if _, err := v.q.Push(wctx, false, core.Request{ID: v.seq, Op: verbs.OpSend, Local: v.out.Range(0, size)}); err != nil {
			return nil, fmt.Errorf("VQ SEND %d B #%d: %w", size, i, err)
		}
		if _, err := v.poll.popMsgs(wctx, v.q, v.msgs); err != nil {
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
			if err := v.q.PushRecv(*m.Buf); err != nil {
				return nil, err
			}
		}
		*m = core.Message{}
		if _, err := v.poll.pop(wctx, v.q, v.comp); err != nil {
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

// vqPoll waits for a VQ's completions or messages the way krbench's
// poller waits for a CQ's, so a VQ and a raw QP measured side by side wait
// alike: poll for spin (yielding now and then when yield is set, as in one
// process), then the runtime's own wait (which spins briefly itself, then
// sleeps on its completion queue).
type vqPoll struct {
	spin  time.Duration
	yield bool
}

func newVQPoll(cfg *config, placement string) vqPoll {
	return vqPoll{spin: cfg.spinFor(placement), yield: placement == placementInproc}
}

// pollThen is vqPoll's loop for Pop/PopWait and PopMsgs/PopMsgsWait.
func pollThen[T any](w vqPoll, ctx context.Context, out []T, poll func([]T) int, wait func(context.Context, []T) (int, error)) (int, error) {
	if n := poll(out); n > 0 {
		return n, nil
	}
	if w.spin > 0 {
		start := time.Now()
		for i := 1; ; i++ {
			if n := poll(out); n > 0 {
				return n, nil
			}
			if i%spinYield != 0 {
				continue
			}
			if w.yield {
				runtime.Gosched()
			}
			if time.Since(start) >= w.spin {
				break
			}
		}
	}
	return wait(ctx, out)
}

func (w vqPoll) pop(ctx context.Context, q core.VQ, out []core.Completion) (int, error) {
	return pollThen(w, ctx, out, q.Pop, q.PopWait)
}

func (w vqPoll) popMsgs(ctx context.Context, q core.VQ, out []core.Message) (int, error) {
	return pollThen(w, ctx, out, q.PopMsgs, q.PopMsgsWait)
}

func (w vqPoll) String() string {
	if w.spin == 0 {
		return "the runtime's PopWait (it spins ~20us itself, then sleeps on its CQ)"
	}
	return "Pop for " + durText(w.spin) + ", then the runtime's PopWait"
}

// deadline hands out a context whose deadline is at least timeout/2 away,
// making a new one only when the old one gets closer: every wait is
// bounded without arming a timer inside each measured operation.
type deadline struct {
	parent  context.Context
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	at      time.Time
}

func newDeadline(parent context.Context, timeout time.Duration) *deadline {
	return &deadline{parent: parent, timeout: timeout}
}

func (d *deadline) get() context.Context {
	now := time.Now()
	if d.ctx == nil || d.at.Sub(now) < d.timeout/2 {
		d.close()
		d.at = now.Add(d.timeout)
		d.ctx, d.cancel = context.WithDeadline(d.parent, d.at)
	}
	return d.ctx
}

func (d *deadline) close() {
	if d.cancel != nil {
		d.cancel()
		d.ctx, d.cancel = nil, nil
	}
}
