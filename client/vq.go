package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/internal/fifo"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// entry is a request pushed and not yet retired, as the client remembers
// it: the daemon's completions name requests by sequence number.
type entry struct {
	seq      uint64
	id       uint64
	op       verbs.Opcode
	signaled bool
}

// VQ is a virtual queue served by the daemon. It implements krcore.VQ and is
// safe for use by several goroutines.
type VQ struct {
	c    *Client
	id   uint64
	blk  *offheap.Block
	ring *wire.Ring
	door *wire.Bell // we ring it
	cq   *wire.Bell // the daemon rings it: completions
	msg  *wire.Bell // the daemon rings it: messages
	ctl  *wire.Bell // the daemon rings it: control SQEs' outcomes

	cqWait  chan struct{} // one sleeper at a time per bell
	msgWait chan struct{}
	ctlWait chan struct{}
	ctlMu   sync.Mutex    // one control SQE in flight, so CtlDone reports ours
	bindTok chan struct{} // held by the Bind or Unbind call in flight, see Bind

	// shut is set when Close (or Client.Close) begins; done closes then,
	// waking waiters queued for a bell. Sleepers look at the ring's
	// counters without mu, so they hold live shared, and release takes it
	// exclusively before it unmaps the ring.
	shut atomic.Bool
	done chan struct{}
	live sync.RWMutex

	// woke is whether the last publish rang the doorbell (see spin).
	woke atomic.Bool

	mu       sync.Mutex
	closed   bool // released: the ring is gone, left and leftMsgs hold what it held
	left     []krcore.Completion
	leftMsgs []krcore.Message
	node     krcore.NodeID
	toPort   bool
	sqTail   uint64           // SQEs written
	pushed   uint64           // requests pushed (SQEs but receives)
	ents     fifo.FIFO[entry] // unretired requests, in push order
	cqHead   uint64
	// The daemon's counters as last read: room reads the ring's only when
	// these say no, so a push costs no cache line the daemon just wrote.
	retiredSeen, sqHeadSeen uint64
	recvs                   []krcore.Local // posted receive buffers, in order
	msgHead                 uint64
}

var _ krcore.VQ = (*VQ)(nil)

// Queue makes a virtual queue: its rings and bells, sent to the daemon.
func (c *Client) Queue() (krcore.VQ, error) {
	v, err := c.newVQ()
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return v, nil
}

func (c *Client) newVQ() (*VQ, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	v, _, err := c.openVQ(ctx, nil)
	return v, err
}

// openVQ makes a VQ's rings and bells and sends them to the daemon in an
// OpQueue; body, if not nil, adds what the daemon does with the new queue
// before it answers (FeatureQueueTo). It returns the reply, read past the
// queue's id.
func (c *Client) openVQ(ctx context.Context, body func(*wire.Msg)) (*VQ, *wire.Msg, error) {
	v := &VQ{c: c, cqWait: make(chan struct{}, 1), msgWait: make(chan struct{}, 1), ctlWait: make(chan struct{}, 1),
		bindTok: make(chan struct{}, 1), done: make(chan struct{})}
	if err := v.alloc(); err != nil {
		v.release()
		return nil, nil, err
	}
	m := wire.NewMsg(wire.OpQueue, 0)
	m.FDs = []int{v.blk.FD(), v.door.FD(), v.cq.FD(), v.msg.FD(), v.ctl.FD()}
	if body != nil {
		body(m)
	}
	r, err := c.callUndo(ctx, m, c.closeOrphanVQ)
	if err == nil {
		v.id = r.GetU64()
		err = r.Err()
	}
	if err != nil {
		v.release()
		return nil, nil, fmt.Errorf("client: queue: %w", err)
	}
	c.mu.Lock()
	c.vqs[v] = struct{}{}
	c.mu.Unlock()
	return v, r, nil
}

// closeOrphanVQ closes in the daemon the queue an OpQueue's response r
// names, made for a caller that stopped waiting.
func (c *Client) closeOrphanVQ(r *wire.Msg) {
	if id := r.GetU64(); r.Err() == nil {
		c.post(wire.NewMsg(wire.OpCloseVQ, 0).U64(id))
	}
}

// QueueTo makes a virtual queue connected to node, as Queue and then the
// queue's Connect do, and, if name is not empty, learns the region node
// exports under name, as the queue's Region then does (asking as no port:
// the new queue holds none). A daemon that offers it
// (wire.FeatureQueueTo) does all of it in one round trip, and looks the
// region up while it connects, where Queue, Connect and Region are three
// round trips one after another, the way a newcomer's first steps went.
// The region is nil when name is empty. On an error no queue is left, and
// the error names the node and the region.
func (c *Client) QueueTo(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions, name string) (krcore.VQ, krcore.Region, error) {
	q, g, err := c.queueTo(ctx, node, opts, name)
	if err != nil {
		if name != "" {
			return nil, nil, fmt.Errorf("client: queue to node %d, region %q: %w", node, name, err)
		}
		return nil, nil, fmt.Errorf("client: queue to node %d: %w", node, err)
	}
	return q, g, nil
}

// queueTo is QueueTo, its errors not yet naming the node and region.
func (c *Client) queueTo(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions, name string) (krcore.VQ, krcore.Region, error) {
	if c.features&wire.FeatureQueueTo == 0 {
		return c.queueThenConnect(ctx, node, opts, name)
	}
	var port uint32
	if opts != nil {
		port = opts.Port
	}
	toPort, flag := port != 0, uint8(0)
	if toPort {
		flag = 1
	}
	v, r, err := c.openVQ(ctx, func(m *wire.Msg) { m.U64(node).U8(flag).U32(port).Str(name) })
	if err != nil {
		return nil, nil, err
	}
	v.mu.Lock()
	v.node, v.toPort = node, toPort
	v.mu.Unlock()
	if name == "" {
		return v, nil, nil
	}
	g, err := c.regionFrom(r, wire.OpVQRegion, node, name)
	if err != nil {
		return nil, nil, errors.Join(err, v.Close())
	}
	return v, g, nil
}

// queueThenConnect is QueueTo for a daemon without FeatureQueueTo: the
// queue made within ctx, then krcore.ConnectQueue.
func (c *Client) queueThenConnect(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions, name string) (krcore.VQ, krcore.Region, error) {
	v, _, err := c.openVQ(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	return krcore.ConnectQueue(ctx, v, node, opts, name)
}

func (v *VQ) alloc() error {
	size := wire.RingSize(v.c.maxMsg)
	var err error
	if v.blk, err = offheap.AllocShared("krcore-vq", size); err != nil {
		return err
	}
	v.ring, _ = wire.NewRing(v.blk.Bytes(), v.c.maxMsg)
	for _, b := range []**wire.Bell{&v.door, &v.cq, &v.msg, &v.ctl} {
		if *b, err = wire.NewBell(); err != nil {
			return err
		}
	}
	return nil
}

// shutdown fails the VQ's calls from now on with ErrClosed and wakes its
// waiters to see it; it reports whether it was the first.
func (v *VQ) shutdown() bool {
	if v.shut.Swap(true) {
		return false
	}
	close(v.done)
	for _, b := range []*wire.Bell{v.cq, v.msg, v.ctl} {
		if b != nil {
			b.Ring()
		}
	}
	return true
}

// errClosed is what calls on a closed VQ fail with.
func (v *VQ) errClosed() error {
	return fmt.Errorf("client: queue %d: %w", v.id, krcore.ErrClosed)
}

// release frees the client's side of the VQ once its sleepers have left,
// keeping the completions and messages its rings still held for Pop and
// PopMsgs, followed by WR_FLUSH_ERR completions of the requests in flight.
func (v *VQ) release() {
	v.live.Lock()
	defer v.live.Unlock()
	v.mu.Lock()
	if v.ring != nil && !v.closed {
		v.left = v.popCQ(v.left, -1)
		v.leftMsgs = v.popMsgRing(v.leftMsgs, -1)
	}
	if !v.closed {
		// No completion reaches this side any more: what the daemon
		// had not finished fails, as a closed embedded runtime's do,
		// so a caller spinning on Pop for them ends.
		v.left = v.flush(v.left, -1)
	}
	v.closed = true
	v.mu.Unlock()
	for _, b := range []*wire.Bell{v.door, v.cq, v.msg, v.ctl} {
		if b != nil {
			b.Close()
		}
	}
	if v.blk != nil {
		v.blk.Close()
	}
}

// wake rouses the VQ's sleepers (the daemon is gone).
func (v *VQ) wake() {
	v.cq.Ring()
	v.msg.Ring()
	v.ctl.Ring()
}

// usable is nil when the VQ may take requests; v.mu held.
func (v *VQ) usable() error {
	if v.closed || v.shut.Load() {
		return v.errClosed()
	}
	if err := v.c.err(); err != nil {
		return err
	}
	if v.node == 0 {
		return krcore.ErrNotConnected
	}
	return nil
}

// Connect points the queue at a node (see core.Queue.Connect). It travels
// on the submission ring, in order with the requests pushed before it, and
// waits the wire way for the daemon's outcome: a warm connect is a ring
// round trip, no system call while both sides keep up.
//
// A queue with requests outstanding (pushed and not popped here) cannot
// move to another node (ErrBusy). The client checks it: the daemon's queue
// forgets a request once its completion is on the ring, before the client
// pops it.
func (v *VQ) Connect(ctx context.Context, node krcore.NodeID, opts *krcore.ConnectOptions) error {
	var port uint32
	if opts != nil {
		port = opts.Port
	}
	if err := v.movable(node); err != nil {
		return fmt.Errorf("client: connect to node %d: %w", node, err)
	}
	toPort := port != 0
	e := wire.SQE{Op: wire.OpConnectSQE, MR: node, Imm: port}
	if toPort {
		e.Flags |= wire.FlagToPort
	}
	v.ctlMu.Lock()
	defer v.ctlMu.Unlock()
	seq, err := v.putCtl(ctx, &e)
	if err == nil {
		err = v.waitCtl(ctx, seq)
	}
	if err != nil {
		return fmt.Errorf("client: connect to node %d: %w", node, err)
	}
	v.mu.Lock()
	v.node, v.toPort = node, toPort
	v.mu.Unlock()
	return nil
}

// movable is nil when the queue may be connected to node: it is open, and
// has no request outstanding or node is the one it is connected to.
func (v *VQ) movable(node krcore.NodeID) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.shut.Load() {
		return v.errClosed()
	}
	if n := v.ents.Len(); n > 0 && node != v.node {
		return fmt.Errorf("queue with %d requests outstanding to node %d: %w", n, v.node, verbs.ErrBusy)
	}
	return nil
}

// putCtl publishes a control SQE once the submission ring has room and
// returns its sequence number; v.ctlMu held.
func (v *VQ) putCtl(ctx context.Context, e *wire.SQE) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	ringRoom := func() bool { return v.sqTail-v.ring.Ctr(wire.SQHead).Load() < wire.SQEntries }
	for {
		if v.closed || v.shut.Load() {
			return 0, v.errClosed()
		}
		if err := v.c.err(); err != nil {
			return 0, err
		}
		if ringRoom() {
			break
		}
		if err := v.waitLocked(ctx, ringRoom); err != nil {
			return 0, err
		}
	}
	seq := v.sqTail
	v.ring.PutSQE(seq, e)
	v.sqTail++
	v.publish()
	return seq, nil
}

// waitCtl waits for the outcome of control SQE seq; v.ctlMu held, so no
// later control SQE can overwrite it.
func (v *VQ) waitCtl(ctx context.Context, seq uint64) error {
	done := v.ring.Ctr(wire.CtlDone)
	finished := func() bool {
		s, _, ok := wire.CtlOutcome(done.Load())
		return ok && s >= seq
	}
	if err := v.sleep(ctx, v.ctlWait, v.ctl, wire.ClientCtl, finished); err != nil {
		return err
	}
	s, code, _ := wire.CtlOutcome(done.Load())
	if s != seq {
		return fmt.Errorf("control outcome for SQE %d, want %d: %w", s, seq, wire.ErrMalformed)
	}
	return v.ring.CtlErr(code)
}

// Push submits requests in order through the submission ring; the daemon
// checks and carries them as the runtime does (see core.Queue.Push).
func (v *VQ) Push(ctx context.Context, wait bool, reqs ...krcore.Request) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.usable(); err != nil {
		return 0, err
	}
	for i := range reqs {
		for !v.room() {
			v.publish()
			if !wait {
				return i, fmt.Errorf("client: push: %d outstanding: %w", v.c.credits, krcore.ErrNoCredit)
			}
			if err := v.waitLocked(ctx, v.room); err != nil {
				return i, err
			}
			if err := v.usable(); err != nil {
				return i, err
			}
		}
		v.put(&reqs[i])
	}
	v.publish()
	return len(reqs), nil
}

// PushOne is Push of one request (see krcore.VQ.PushOne).
func (v *VQ) PushOne(ctx context.Context, wait bool, req krcore.Request) error {
	_, err := v.Push(ctx, wait, req)
	return err
}

// room reports whether one more request fits the credits and the ring;
// v.mu held.
func (v *VQ) room() bool {
	if v.ents.Len() >= 4*v.c.credits {
		return false
	}
	if v.pushed-v.retiredSeen >= uint64(v.c.credits) {
		v.retiredSeen = v.ring.Ctr(wire.Retired).Load()
	}
	if v.sqTail-v.sqHeadSeen >= wire.SQEntries {
		v.sqHeadSeen = v.ring.Ctr(wire.SQHead).Load()
	}
	return v.pushed-v.retiredSeen < uint64(v.c.credits) && v.sqTail-v.sqHeadSeen < wire.SQEntries
}

// put writes one request's SQE; v.mu held.
func (v *VQ) put(r *krcore.Request) {
	e := wire.SQE{Op: uint8(r.Op), Imm: r.Imm, MR: v.c.mrID(r.Local.MR), Off: uint64(r.Local.Off),
		Len: uint64(r.Local.Len), Region: v.c.regionID(r.Remote.Region), RemoteOff: r.Remote.Off,
		Compare: r.Compare, Swap: r.Swap}
	if r.Unsignaled {
		e.Flags |= wire.FlagUnsignaled
	}
	v.ring.PutSQE(v.sqTail, &e)
	v.ents.Push(entry{seq: v.sqTail, id: r.ID, op: r.Op, signaled: !r.Unsignaled})
	v.sqTail++
	v.pushed++
}

// publish hands the written SQEs to the daemon; v.mu held.
func (v *VQ) publish() {
	r := v.ring
	if r.Ctr(wire.SQTail).Load() == v.sqTail {
		return
	}
	wire.Publish(r.Ctr(wire.SQTail), v.sqTail)
	v.woke.Store(wire.Notify(r.Ctr(wire.DaemonSleeps), v.door))
}

// waitLocked releases v.mu while it waits for cond on the completion bell.
func (v *VQ) waitLocked(ctx context.Context, cond func() bool) error {
	v.mu.Unlock()
	defer v.mu.Lock()
	return v.sleep(ctx, v.cqWait, v.cq, wire.ClientCQ, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return cond()
	})
}

// sleep waits the wire way for ready, one sleeper per bell at a time,
// until ctx ends, the daemon goes or the VQ closes (ErrClosed).
func (v *VQ) sleep(ctx context.Context, token chan struct{}, bell *wire.Bell, flag int, ready func() bool) error {
	v.live.RLock()
	defer v.live.RUnlock()
	if v.shut.Load() {
		return v.errClosed()
	}
	select {
	case token <- struct{}{}:
	case <-v.done:
		return v.errClosed()
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-token }()
	stop := func() error {
		if v.shut.Load() {
			return v.errClosed()
		}
		return v.c.err()
	}
	err := wire.Wait(ctx, v.spin(flag), ready, v.ring.Ctr(flag), bell, stop)
	if errors.Is(err, wire.ErrBellClosed) {
		return v.errClosed()
	}
	return err
}

// spin is how long a waiter on flag polls the rings before it sleeps:
// SpinFor, but nothing for a message (ClientMsg) after a publish that rang
// the doorbell. Then the pump was asleep, and a message answers a request
// only after the pump has woken (a cross-process wake-up) and the fabric's
// round trip, while on a machine of few cores a spinning waiter holds the
// core the pump it just woke needs: the pump ran only once the spin was
// over. A completion may still come within the spin (an own-node READ),
// and a waiter that catches it there needs no wake-up of its own, which
// beside a flooding client waits for a core (see daemon.Config.ShareQuantum):
// without the spin there the victim's p99 beside a flood rose relative to
// its quiet one (TestFloodFairness).
func (v *VQ) spin(flag int) time.Duration {
	if flag == wire.ClientMsg && v.woke.Load() {
		return 0
	}
	return wire.SpinFor
}

// Pop moves finished requests' completions into out, in push order. It
// never blocks. Once the daemon is gone, the requests it never finished
// complete with WR_FLUSH_ERR.
func (v *VQ) Pop(out []krcore.Completion) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		k := copy(out, v.left)
		v.left = v.left[k:]
		return k
	}
	k := len(v.popCQ(out[:0], len(out))) // fills out in place
	if k < len(out) && v.cqHead == v.ring.Ctr(wire.CQTail).Load() && v.c.err() != nil && !v.shut.Load() {
		k += len(v.flush(out[k:k], len(out)-k))
	}
	return k
}

// popCQ appends up to max (-1: all) completions from the completion ring
// to out and tells the daemon; v.mu held, the ring mapped.
func (v *VQ) popCQ(out []krcore.Completion, max int) []krcore.Completion {
	r := v.ring
	head, tail := v.cqHead, r.Ctr(wire.CQTail).Load()
	for len(out) != max && v.cqHead != tail {
		e := r.GetCQE(v.cqHead)
		v.cqHead++
		if c, ok := v.retire(e); ok {
			out = append(out, c)
		}
	}
	if v.cqHead != head {
		// Stored only when it moved: a spinning Pop that wrote it every
		// time would take the line from the daemon, which reads it.
		wire.Publish(r.Ctr(wire.CQHead), v.cqHead)
		if r.Ctr(wire.DaemonFullCQ).Load() != 0 {
			v.door.Ring()
		}
	}
	return out
}

// retire matches a completion to its request: earlier unsignaled requests
// retired silently; v.mu held.
func (v *VQ) retire(e wire.CQE) (krcore.Completion, bool) {
	ents := v.ents.Items()
	k := 0
	for k < len(ents) && ents[k].seq < e.Seq {
		k++
	}
	if k == len(ents) || ents[k].seq != e.Seq {
		v.ents.Drop(k)
		return krcore.Completion{}, false // not ours: a confused daemon
	}
	x := ents[k]
	v.ents.Drop(k + 1)
	return krcore.Completion{ID: x.id, Op: x.op, Status: e.Status, Len: int(e.Len)}, true
}

// flush appends up to max (-1: all) unretired requests to out as
// WR_FLUSH_ERR completions and retires them; v.mu held.
func (v *VQ) flush(out []krcore.Completion, max int) []krcore.Completion {
	k := 0
	for _, x := range v.ents.Items() {
		if len(out) == max {
			break
		}
		out = append(out, krcore.Completion{ID: x.id, Op: x.op, Status: verbs.WRFlushErr})
		k++
	}
	v.ents.Drop(k)
	return out
}

// PopWait is Pop that waits for at least one completion: it spins briefly,
// then sleeps on the completion bell, until ctx ends or the daemon goes.
// An empty out could never take one: it is refused at once (ErrInvalid).
func (v *VQ) PopWait(ctx context.Context, out []krcore.Completion) (int, error) {
	if len(out) == 0 {
		return 0, fmt.Errorf("client: pop wait: no room for a completion: %w", verbs.ErrInvalid)
	}
	for {
		if n := v.Pop(out); n > 0 {
			return n, nil
		}
		if v.shut.Load() {
			return 0, v.errClosed()
		}
		if err := v.c.err(); err != nil {
			return 0, err
		}
		err := v.sleep(ctx, v.cqWait, v.cq, wire.ClientCQ, func() bool {
			return v.ring.Ctr(wire.CQTail).Load() != v.ring.Ctr(wire.CQHead).Load()
		})
		if err != nil && v.c.err() == nil {
			return 0, err
		}
	}
}

// Outstanding is the number of requests pushed and not yet retired: a
// closed VQ's count their completions that Pop has yet to return.
func (v *VQ) Outstanding() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ents.Len() + len(v.left)
}

// Region learns the region named name on the node the queue is connected
// to, asking as the port the queue is bound to: the daemon asks as that
// port only because this client's queue holds it (see krcore.VQ.Region).
// A closed queue fails with ErrClosed.
func (v *VQ) Region(ctx context.Context, name string) (krcore.Region, error) {
	v.mu.Lock()
	node, closed := v.node, v.closed || v.shut.Load()
	v.mu.Unlock()
	switch {
	case closed: // the daemon forgot the VQ: it would refuse the id
		return nil, fmt.Errorf("client: region %q: %w", name, v.errClosed())
	case node == 0:
		return nil, fmt.Errorf("client: region %q: %w", name, krcore.ErrNotConnected)
	}
	return v.c.region(ctx, wire.NewMsg(wire.OpVQRegion, 0).U64(v.id).Str(name), node, name)
}

// Close releases the queue here and in the daemon.
//
// Its waiters wake and fail with ErrClosed; completions and messages that
// had arrived are still popped first.
func (v *VQ) Close() error {
	if !v.shutdown() {
		return v.errClosed()
	}
	_, err := v.c.callT(wire.NewMsg(wire.OpCloseVQ, 0).U64(v.id))
	v.c.mu.Lock()
	delete(v.c.vqs, v)
	v.c.mu.Unlock()
	v.release()
	if err != nil && !errors.Is(err, krcore.ErrDaemonGone) {
		return fmt.Errorf("client: close queue: %w", err)
	}
	return nil
}
