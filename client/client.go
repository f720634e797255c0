// Package client attaches a process to krcored, the node's shared KRCore
// runtime, and offers the same Go API as the embedded runtime: a *Client is
// a krcore.API and its queues are krcore.VQs, so the caller chooses between
// client.Attach (share the node's runtime with every process) and
// core.Embed(rt) (a runtime of its own) and writes the rest once.
//
// Memory a client registers lives in memfds the daemon maps (RegMR makes
// one; Register accepts offheap.AllocShared memory). Pushes and completions
// travel through rings in shared memory (see package wire); the control
// calls (Queue, Connect, RegMR, Region ...) are round trips on a Unix
// socket. Calls without a context are bounded by Options.CallTimeout.
//
// When the daemon goes (shutdown, crash) every call fails with an error
// matching krcore.ErrDaemonGone; requests in flight complete with WR_FLUSH_ERR, as
// on a QP moved to the error state. Attach again once a daemon is back.
package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// Options configures Attach.
type Options struct {
	// Socket is the daemon's socket; default wire.DefaultSocket().
	Socket string
	// CallTimeout bounds the calls that take no context; default 10s.
	CallTimeout time.Duration
}

// Client is a process's attachment to krcored. It implements krcore.API.
type Client struct {
	conn    *net.UnixConn
	id      uint64
	node    krcore.NodeID
	credits int
	maxMsg  int
	// features is what the daemon does beyond the first protocol
	// (wire.Features); 0 from a daemon of the first protocol.
	features uint32
	timeout  time.Duration

	seq     atomic.Uint64
	sendTok chan struct{} // held by the one sender: each sets the connection's write deadline
	mu      sync.Mutex
	pending map[uint64]chan *wire.Msg
	// orphans take the responses of calls whose callers stopped waiting
	// (callLate), when they come: to undo what the daemon did for them.
	orphans map[uint64]func(*wire.Msg)
	undos   sync.WaitGroup // orphans running; Close waits for them
	gone    error
	closed  bool // Close was called
	vqs     map[*VQ]struct{}
	blocks  map[uint64]*offheap.Block // memory RegMR allocated, by MR id
	done    chan struct{}             // closed when the reader stops
}

var _ krcore.API = (*Client)(nil)

// Attach connects to the daemon at opt.Socket.
func Attach(ctx context.Context, opt Options) (*Client, error) {
	c, rx, err := dial(ctx, opt)
	if err != nil {
		return nil, err
	}
	hello, err := c.begin(ctx, helloMsg())
	if err == nil {
		err = c.readFirst(ctx, rx, hello)
	}
	go c.read(rx)
	if err == nil {
		err = c.hello(ctx, hello)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dial connects to the daemon at opt.Socket. The caller sends HELLO and
// starts the client's reader on rx, the connection's receiver.
func dial(ctx context.Context, opt Options) (*Client, *wire.Receiver, error) {
	if opt.Socket == "" {
		opt.Socket = wire.DefaultSocket()
	}
	if opt.CallTimeout <= 0 {
		opt.CallTimeout = 10 * time.Second
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", opt.Socket)
	if err != nil {
		return nil, nil, fmt.Errorf("client: attach %s: %w: %w", opt.Socket, krcore.ErrDaemonGone, err)
	}
	c := &Client{conn: nc.(*net.UnixConn), timeout: opt.CallTimeout, pending: make(map[uint64]chan *wire.Msg), orphans: make(map[uint64]func(*wire.Msg)),
		vqs: make(map[*VQ]struct{}), blocks: make(map[uint64]*offheap.Block), done: make(chan struct{}),
		sendTok: make(chan struct{}, 1)}
	return c, wire.NewReceiver(c.conn), nil
}

// readFirst takes the daemon's messages in the caller's goroutine until
// first has its response, or ctx ends; the client's reader starts on rx
// after it. A newcomer's first answer so wakes only the goroutine that
// waits for it, where the reader's hand-off to that goroutine cost a fresh
// process more thread wake-ups (MEASUREMENTS.md, session 20).
func (c *Client) readFirst(ctx context.Context, rx *wire.Receiver, first *sent) error {
	err := bound(ctx, c.conn.SetReadDeadline, func() error {
		for len(first.ch) == 0 {
			m, err := rx.Recv()
			if err != nil {
				return err
			}
			if !c.dispatch(m) {
				return fmt.Errorf("the daemon said bye: %s", m.GetStr())
			}
		}
		return nil
	})
	switch {
	case err == nil:
		c.conn.SetReadDeadline(time.Time{}) // the reader's reads have none
		return nil
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("client: attach: %w", err)
	}
	return fmt.Errorf("client: attach: %w: %w", krcore.ErrDaemonGone, err)
}

func helloMsg() *wire.Msg { return wire.NewMsg(wire.OpHello, 0).U32(wire.Version) }

// hello takes HELLO's answer: the client's id, the node, its credits, the
// largest message and the daemon's features.
func (c *Client) hello(ctx context.Context, p *sent) error {
	r, _, err := c.await(ctx, p, nil)
	if err != nil {
		return fmt.Errorf("client: hello: %w", err)
	}
	c.id, c.node, c.credits, c.maxMsg = r.GetU64(), r.GetU64(), int(r.GetU32()), int(r.GetU32())
	if r.More() {
		c.features = r.GetU32()
	}
	return r.Err()
}

// read dispatches the daemon's messages from rx until the connection
// ends; then the client is gone.
func (c *Client) read(rx *wire.Receiver) {
	defer close(c.done)
	reason := "connection closed"
	defer rx.Release()
	for {
		m, err := rx.Recv()
		if err != nil {
			break
		}
		if !c.dispatch(m) {
			reason = m.GetStr()
			break
		}
	}
	c.markGone(reason)
}

// dispatch hands m to the call that waits for it, or to its orphan's
// undo; it reports false for the daemon's OpBye, m's body the reason.
func (c *Client) dispatch(m *wire.Msg) bool {
	m.CloseFDs()
	if m.Op == wire.OpBye {
		return false
	}
	c.mu.Lock()
	ch := c.pending[m.Seq]
	delete(c.pending, m.Seq)
	undo := c.orphans[m.Seq]
	delete(c.orphans, m.Seq)
	c.mu.Unlock()
	switch {
	case ch != nil:
		ch <- m
	case undo != nil:
		// Not here: its request goes out on the connection this
		// loop drains.
		c.undos.Go(func() { undo(m) })
	}
	return true
}

// markGone fails every call from now on and wakes every waiter.
func (c *Client) markGone(reason string) {
	c.mu.Lock()
	if c.gone == nil {
		c.gone = fmt.Errorf("%w: %s", krcore.ErrDaemonGone, reason)
	}
	vqs := make([]*VQ, 0, len(c.vqs))
	for v := range c.vqs {
		vqs = append(vqs, v)
	}
	c.mu.Unlock()
	c.conn.Close()
	for _, v := range vqs {
		v.wake()
	}
}

// err is why the client can no longer call, or nil.
func (c *Client) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

// call sends a request and waits for its response.
func (c *Client) call(ctx context.Context, m *wire.Msg) (*wire.Msg, error) {
	return c.callUndo(ctx, m, nil)
}

// callUndo is call for a request that makes something in the daemon:
// if ctx ends first, undo (if not nil) gets the successful response when
// it comes, to release what the daemon made for a caller that gave up.
func (c *Client) callUndo(ctx context.Context, m *wire.Msg, undo func(*wire.Msg)) (*wire.Msg, error) {
	var late func(*wire.Msg)
	if undo != nil {
		late = func(r *wire.Msg) {
			if r.Code == wire.CodeOK {
				undo(r)
			}
		}
	}
	r, _, err := c.callLate(ctx, m, late)
	return r, err
}

// callLate is call whose response, if ctx ends after the request went
// out, goes to late (if not nil) whatever its code when it comes;
// orphaned reports that late took it. A client gone never calls it.
func (c *Client) callLate(ctx context.Context, m *wire.Msg, late func(*wire.Msg)) (_ *wire.Msg, orphaned bool, _ error) {
	p, err := c.begin(ctx, m)
	if err != nil {
		return nil, false, err
	}
	return c.await(ctx, p, late)
}

// sent is a request that went out and whose response await takes.
type sent struct {
	op  wire.Op
	seq uint64
	ch  chan *wire.Msg
}

// begin sends m, its response awaited by await: a caller may send more
// before it waits for the first answer. On an error nothing was sent.
func (c *Client) begin(ctx context.Context, m *wire.Msg) (*sent, error) {
	m.Seq = c.seq.Add(1)
	p := &sent{op: m.Op, seq: m.Seq, ch: make(chan *wire.Msg, 1)}
	c.mu.Lock()
	if c.gone != nil {
		c.mu.Unlock()
		return nil, c.gone
	}
	c.pending[m.Seq] = p.ch
	c.mu.Unlock()
	err := c.send(ctx, m)
	if err == nil {
		return p, nil
	}
	c.forgetCall(p)
	switch {
	case errors.Is(err, verbs.ErrInvalid): // not sent: too long
		return nil, fmt.Errorf("client: %w", err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled): // not sent
		return nil, fmt.Errorf("client: op %d: %w", m.Op, err)
	}
	if gone := c.err(); gone != nil {
		return nil, gone
	}
	return nil, fmt.Errorf("client: %w: %w", krcore.ErrDaemonGone, err)
}

// forgetCall stops waiting for p's response: read drops it when it comes.
func (c *Client) forgetCall(p *sent) {
	c.mu.Lock()
	delete(c.pending, p.seq)
	c.mu.Unlock()
}

// await waits for the response to p as callLate does.
func (c *Client) await(ctx context.Context, p *sent, late func(*wire.Msg)) (_ *wire.Msg, orphaned bool, _ error) {
	defer c.forgetCall(p)
	select {
	case r := <-p.ch:
		return r, false, r.Error()
	case <-c.done:
		return nil, false, c.err()
	case <-ctx.Done():
		if late != nil {
			c.orphan(p.seq, p.ch, late)
		}
		return nil, late != nil, fmt.Errorf("client: op %d: %w", p.op, ctx.Err())
	}
}

// orphan hands the response to call seq, which its caller no longer waits
// for on ch, to late: when it comes (read), or now if read passed it on
// meanwhile.
func (c *Client) orphan(seq uint64, ch chan *wire.Msg, late func(*wire.Msg)) {
	c.mu.Lock()
	if _, waiting := c.pending[seq]; waiting {
		delete(c.pending, seq)
		c.orphans[seq] = late
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	late(<-ch) // read took it from pending: it is on its way
}

// deregisterOrphan deregisters in the daemon the MR an OpRegister's
// response r names, registered for a caller that stopped waiting.
func (c *Client) deregisterOrphan(r *wire.Msg) {
	if id := r.GetU64(); r.Err() == nil {
		c.post(wire.NewMsg(wire.OpDeregister, 0).U64(id))
	}
}

// post sends m and does not wait for its response (read drops it); the
// send waits the client's call timeout at most.
func (c *Client) post(m *wire.Msg) error {
	m.Seq = c.seq.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return c.send(ctx, m)
}

// send sends m, waiting for its turn and for room in the socket, which a
// daemon that stops reading fills, no longer than ctx allows. A send cut
// short sent nothing: the socket takes a message whole or not at all.
func (c *Client) send(ctx context.Context, m *wire.Msg) error {
	select {
	case c.sendTok <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.sendTok }()
	return bound(ctx, c.conn.SetWriteDeadline, func() error { return wire.Send(c.conn, m) })
}

// bound runs io, a read or a write of the connection, cut short when ctx
// ends: set sets io's deadline (SetReadDeadline or SetWriteDeadline), and
// io's error is then ctx's. When bound returns, nothing sets the deadline
// again: the next caller's is not overwritten.
func bound(ctx context.Context, set func(time.Time) error, io func() error) error {
	dl, _ := ctx.Deadline() // none: zero, no deadline
	set(dl)
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		set(time.Unix(1, 0)) // in the past: io returns
		close(cut)
	})
	err := io()
	if !stop() {
		<-cut // set has run: nothing sets the deadline after bound
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded): // ctx's deadline, reached by the socket's timer first
		return context.DeadlineExceeded
	}
	return err
}

// callT is call bounded by the client's timeout, for the API's calls
// without a context.
func (c *Client) callT(m *wire.Msg) (*wire.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return c.call(ctx, m)
}

// ID is the daemon's id for this client (krctl lists it).
func (c *Client) ID() uint64 { return c.id }

// Node is the id of the daemon's node.
func (c *Client) Node() krcore.NodeID { return c.node }

// RegMR allocates size bytes of memfd-backed memory and registers them with
// the daemon.
func (c *Client) RegMR(size int, access verbs.Access) (krcore.MR, error) {
	if size <= 0 {
		return nil, fmt.Errorf("client: register %d bytes: %w", size, verbs.ErrInvalid)
	}
	blk, err := offheap.AllocShared("krcore-mr", size)
	if err != nil {
		return nil, fmt.Errorf("client: register %d bytes: %w", size, err)
	}
	m, err := c.Register(blk.Bytes(), access)
	if err != nil {
		blk.Close()
		return nil, err
	}
	c.mu.Lock()
	c.blocks[m.(*mr).id] = blk
	c.mu.Unlock()
	return m, nil
}

// Register registers buf, which must lie in offheap.AllocShared memory: its
// memfd goes to the daemon, which maps the same pages.
func (c *Client) Register(buf []byte, access verbs.Access) (krcore.MR, error) {
	blk, off, err := offheap.Find(buf)
	if err != nil {
		return nil, fmt.Errorf("client: register: %w: %w", verbs.ErrInvalid, err)
	}
	if blk.FD() < 0 {
		return nil, fmt.Errorf("client: register: memory is not memfd-backed (use offheap.AllocShared): %w", verbs.ErrInvalid)
	}
	m := wire.NewMsg(wire.OpRegister, 0).U64(uint64(off)).U64(uint64(len(buf))).U32(uint32(access))
	m.FDs = []int{blk.FD()}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	r, err := c.callUndo(ctx, m, c.deregisterOrphan)
	if err != nil {
		return nil, fmt.Errorf("client: register %d bytes: %w", len(buf), err)
	}
	id := r.GetU64()
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("client: register %d bytes: %w", len(buf), err)
	}
	return &mr{c: c, id: id, buf: buf, access: access}, nil
}

// Deregister releases an MR from RegMR or Register. A second Deregister
// of it fails with krcore.ErrClosed, as the embedded runtime's does.
func (c *Client) Deregister(m krcore.MR) error {
	id := c.mrID(m)
	if id == 0 {
		return fmt.Errorf("client: deregister an MR of another runtime: %w", krcore.ErrRefused)
	}
	if m.(*mr).gone.Swap(true) {
		return fmt.Errorf("client: deregister MR %d: %w", id, krcore.ErrClosed)
	}
	_, err := c.callT(wire.NewMsg(wire.OpDeregister, 0).U64(id))
	c.mu.Lock()
	blk := c.blocks[id]
	delete(c.blocks, id)
	c.mu.Unlock()
	if blk != nil {
		blk.Close()
	}
	if err != nil {
		return fmt.Errorf("client: deregister: %w", err)
	}
	return nil
}

// Export offers n bytes at offset off of mr under name, to every node or
// only to the principals to (see krcore.API.Export). A closed client fails
// it with ErrClosed before it looks at the arguments, as the embedded
// runtime does.
func (c *Client) Export(name string, mr krcore.MR, off, n int, access verbs.Access, to ...krcore.Principal) error {
	if err := c.err(); err != nil {
		return fmt.Errorf("client: export %q: %w", name, err)
	}
	id := c.mrID(mr)
	if id == 0 {
		return fmt.Errorf("client: export %q from an MR of another runtime: %w", name, krcore.ErrRefused)
	}
	if off < 0 || n <= 0 {
		return fmt.Errorf("client: export %q [%d,+%d): %w", name, off, n, verbs.ErrInvalid)
	}
	if len(to) > krcore.MaxAudience {
		return fmt.Errorf("client: export %q to %d principals, more than %d: %w", name, len(to), krcore.MaxAudience, verbs.ErrLimit)
	}
	m := wire.NewMsg(wire.OpExport, 0).Str(name).U64(id).U64(uint64(off)).U64(uint64(n)).U32(uint32(access))
	if len(to) > 0 {
		m.U32(uint32(len(to)))
		for _, p := range to {
			m.U64(p.Node).U32(p.Port)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	// Given up on, a made export would keep the name taken (a retry's
	// ErrBusy) and the memory open until the client detached.
	_, err := c.callUndo(ctx, m, func(*wire.Msg) { c.post(wire.NewMsg(wire.OpUnexport, 0).Str(name)) })
	return wrap("export", err)
}

// Unexport withdraws a name this client exported.
func (c *Client) Unexport(name string) error {
	_, err := c.callT(wire.NewMsg(wire.OpUnexport, 0).Str(name))
	return wrap("unexport", err)
}

// Region learns the region node exports under name, asking as no port
// (see krcore.API.Region).
func (c *Client) Region(ctx context.Context, node krcore.NodeID, name string) (krcore.Region, error) {
	return c.region(ctx, wire.NewMsg(wire.OpRegion, 0).U64(node).Str(name), node, name)
}

// region makes the region an OpRegion or OpVQRegion m asks node for; the
// reply's last field is reserved (OpRegion) or the node (OpVQRegion).
func (c *Client) region(ctx context.Context, m *wire.Msg, node krcore.NodeID, name string) (krcore.Region, error) {
	r, err := c.call(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("client: region %q of node %d: %w", name, node, err)
	}
	return c.regionFrom(r, m.Op, node, name)
}

// regionFrom reads a region's fields from r, the reply to op: OpRegion's
// last field is reserved, OpVQRegion's (and OpQueue's) is the node asked.
func (c *Client) regionFrom(r *wire.Msg, op wire.Op, node krcore.NodeID, name string) (krcore.Region, error) {
	id, n, access, last := r.GetU64(), r.GetU64(), verbs.Access(r.GetU32()), r.GetU64()
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("client: region %q of node %d: %w", name, node, err)
	}
	if op != wire.OpRegion {
		node = last // the node the daemon's queue asked, whatever the VQ did meanwhile
	}
	return &region{c: c, id: id, node: node, name: name, len: n, access: access}, nil
}

// Stats reports the daemon runtime's counters (zero when it is gone).
func (c *Client) Stats() krcore.Stats {
	r, err := c.callT(wire.NewMsg(wire.OpStats, 0))
	if err != nil {
		return krcore.Stats{}
	}
	return wire.GetStats(r)
}

// Status is the daemon's status report (what krctl prints).
func (c *Client) Status(ctx context.Context) ([]byte, error) {
	r, err := c.call(ctx, wire.NewMsg(wire.OpStatus, 0))
	if err != nil {
		return nil, fmt.Errorf("client: status: %w", err)
	}
	return []byte(r.GetStr()), r.Err()
}

// Close detaches: the daemon reclaims the client's VQs, MRs and exports.
// Calls from now on, and those waiting, fail with krcore.ErrClosed. The
// memory of RegMR's MRs is released but its addresses stay mapped to zero
// pages (offheap.Block.Retire), so a slice of it still held reads zeros
// and writes into nothing instead of faulting.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("client: %w", krcore.ErrClosed)
	}
	c.closed = true
	if c.gone == nil {
		c.gone = fmt.Errorf("client: %w", krcore.ErrClosed)
	}
	c.mu.Unlock()
	c.conn.Close()
	<-c.done
	c.undos.Wait()
	c.mu.Lock()
	vqs := make([]*VQ, 0, len(c.vqs))
	for v := range c.vqs {
		vqs = append(vqs, v)
	}
	blocks := c.blocks
	c.blocks = map[uint64]*offheap.Block{}
	c.mu.Unlock()
	for _, v := range vqs {
		v.shutdown()
		v.release()
	}
	// Retired, not unmapped: a layer above (an smc Conn's buffers) may
	// still hold MR.Bytes slices as the client closes under it.
	for _, b := range blocks {
		b.Retire()
	}
	return nil
}

func wrap(what string, err error) error {
	if err != nil {
		return fmt.Errorf("client: %s: %w", what, err)
	}
	return nil
}

// Report keeps body (JSON, at most wire.MaxReport bytes) at the daemon
// under name, replacing the client's report of that name, until the
// client detaches; an empty body withdraws it. Libraries that run in the
// client's process tell krctl and the daemon's metrics about themselves
// this way (package smc's Node reports its connections).
func (c *Client) Report(ctx context.Context, name string, body []byte) error {
	if len(body) > wire.MaxReport {
		return fmt.Errorf("client: report %s: %d bytes, over %d: %w", name, len(body), wire.MaxReport, verbs.ErrLimit)
	}
	if _, err := c.call(ctx, wire.NewMsg(wire.OpReport, 0).Str(name).Str(string(body))); err != nil {
		return fmt.Errorf("client: report %s: %w", name, err)
	}
	return nil
}

// Reports lists the attached clients' reports whose names start with
// prefix (every client's, this one's included), by client and name.
func (c *Client) Reports(ctx context.Context, prefix string) ([]wire.Report, error) {
	var out []wire.Report
	for {
		r, err := c.call(ctx, wire.NewMsg(wire.OpReports, 0).Str(prefix).U32(uint32(len(out))))
		if err != nil {
			return nil, fmt.Errorf("client: reports: %w", err)
		}
		total, k := int(r.GetU32()), int(r.GetU32())
		for range k {
			out = append(out, wire.GetReport(r))
		}
		if err := r.Err(); err != nil {
			return nil, fmt.Errorf("client: reports: %w", err)
		}
		if k == 0 || len(out) >= total {
			return out, nil
		}
	}
}
