package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/verbs"
)

// Control messages travel between runtimes on port 0. Each is a type byte,
// a request id (8 bytes, little-endian) and a body.
const (
	ctlRegionReq = iota + 1 // body: region name
	ctlRegionResp
	ctlRCReq // body: marshalled verbs.Endpoint of the caller's new RC QP
	ctlRCResp
	ctlRCClose // body: the closing side's QPN (4) and the receiver's QPN (4)
	ctlRCCloseResp
	ctlRCReady // body: the caller's QPN (4) and the receiver's QPN (4)
	ctlRCReadyResp
)

// ctlMax bounds a control message.
const ctlMax = 512

// control serves port 0: region lookups and RC connection set-up for other
// nodes, and the replies to this node's own calls.
type control struct {
	rt      *Runtime
	q       *Queue
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan []byte
}

func newControl(rt *Runtime) *control {
	c := &control{rt: rt, pending: make(map[uint64]chan []byte)}
	q, _ := rt.Queue()
	q.port.Store(0)
	rt.mu.Lock()
	rt.ports[0] = q
	rt.mu.Unlock()
	c.q = q
	rt.wg.Add(1)
	go c.serve()
	return c
}

// serve handles control messages until the runtime stops.
func (c *control) serve() {
	defer c.rt.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-c.rt.stop
		cancel()
	}()
	msgs := make([]Message, 16)
	for {
		n, err := c.q.PopMsgsWait(ctx, msgs)
		if err != nil {
			return
		}
		for i := range msgs[:n] {
			hctx, cancel := context.WithTimeout(ctx, c.rt.retryTimeout())
			c.handle(hctx, &msgs[i])
			cancel()
			msgs[i] = Message{}
		}
	}
}

func (c *control) handle(ctx context.Context, m *Message) {
	if len(m.Data) < 9 {
		return
	}
	typ, id, body := m.Data[0], binary.LittleEndian.Uint64(m.Data[1:]), m.Data[9:]
	if typ%2 == 0 { // a reply to one of our calls
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- body
		}
		return
	}
	var resp []byte
	switch typ {
	case ctlRegionReq:
		resp = c.rt.describeRegion(string(body))
	case ctlRCReq:
		resp = c.rt.acceptRC(ctx, m.From, body)
	case ctlRCClose:
		resp = c.rt.closeRC(m.From, body)
	case ctlRCReady:
		resp = c.rt.readyRC(m.From, body)
	default:
		return
	}
	if err := c.send(ctx, m.From, typ+1, id, resp); err != nil {
		c.rt.log.Warn("control reply failed", "to", m.From, "type", typ, "err", err)
	}
}

// send sends one control message to node's port 0.
func (c *control) send(ctx context.Context, node NodeID, typ byte, id uint64, body []byte) error {
	if len(body)+9 > ctlMax {
		return fmt.Errorf("core: control message of %d bytes: %w", len(body), verbs.ErrLimit)
	}
	q, err := c.rt.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Connect(ctx, node, ToPort(0)); err != nil {
		return err
	}
	mr, err := c.rt.RegMR(ctlMax, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer c.rt.Deregister(mr)
	b := mr.Bytes()
	b[0] = typ
	binary.LittleEndian.PutUint64(b[1:], id)
	n := 9 + copy(b[9:], body)
	if _, err := q.Push(ctx, true, Request{Op: verbs.OpSend, Local: mr.Range(0, n)}); err != nil {
		return err
	}
	var out [1]Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil {
		return err
	}
	return out[0].Err()
}

// call sends a control request to node and waits for its reply.
func (c *control) call(ctx context.Context, node NodeID, typ byte, body []byte) ([]byte, error) {
	id := c.nextID.Add(1)
	ch := make(chan []byte, 1)
	c.mu.Lock()
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()
	if err := c.send(ctx, node, typ, id, body); err != nil {
		return nil, err
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("core: control call to node %d: %w", node, ctx.Err())
	case <-c.rt.stop:
		return nil, ErrClosed
	}
}

// export is a region this node offers under a name.
type export struct {
	mr     *MR
	off    int
	len    int
	access verbs.Access
}

// Export offers n bytes at offset off of mr to every node under name, with
// the remote access given (a subset of the MR's). A client learns it with
// Region; Unexport or Deregister revokes it.
func (rt *Runtime) Export(name string, mr *MR, off, n int, access verbs.Access) error {
	if !rt.ownMR(mr) {
		return fmt.Errorf("core: export %q from an MR of another runtime: %w", name, ErrRefused)
	}
	if name == "" || len(name) > 200 || off < 0 || n <= 0 || off+n > mr.Len() {
		return fmt.Errorf("core: export %q [%d,+%d) of a %d-byte MR: %w", name, off, n, mr.Len(), verbs.ErrInvalid)
	}
	remote := verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	if access&^remote != 0 || access&^mr.access != 0 {
		return fmt.Errorf("core: export %q with %s from an MR with %s: %w", name, access, mr.access, verbs.ErrInvalid)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if _, dup := rt.exports[name]; dup {
		return fmt.Errorf("core: export %q: name taken: %w", name, verbs.ErrBusy)
	}
	rt.exports[name] = &export{mr: mr, off: off, len: n, access: access}
	return nil
}

// Unexport withdraws a name. Clients that learned it keep their handle;
// revoke access for good by deregistering the MR.
func (rt *Runtime) Unexport(name string) {
	rt.mu.Lock()
	delete(rt.exports, name)
	rt.mu.Unlock()
}

func (rt *Runtime) unexportMR(m *MR) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for name, e := range rt.exports {
		if e.mr == m {
			delete(rt.exports, name)
		}
	}
}

// describeRegion answers a region lookup: status (1 byte; 0 found), then
// address, rkey, length and access.
func (rt *Runtime) describeRegion(name string) []byte {
	rt.mu.Lock()
	e := rt.exports[name]
	rt.mu.Unlock()
	if e == nil || !e.mr.live() {
		return []byte{1}
	}
	b := make([]byte, 1, 25)
	b = binary.LittleEndian.AppendUint64(b, e.mr.mr.Addr()+uint64(e.off))
	b = binary.LittleEndian.AppendUint32(b, e.mr.mr.RKey())
	b = binary.LittleEndian.AppendUint64(b, uint64(e.len))
	return binary.LittleEndian.AppendUint32(b, uint32(e.access))
}

// Region learns the region node exports under name.
func (rt *Runtime) Region(ctx context.Context, node NodeID, name string) (*Region, error) {
	resp, err := rt.ctrl.call(ctx, node, ctlRegionReq, []byte(name))
	if err != nil {
		return nil, fmt.Errorf("core: region %q of node %d: %w", name, node, err)
	}
	if len(resp) != 25 || resp[0] != 0 {
		return nil, fmt.Errorf("core: region %q of node %d: %w", name, node, ErrNoRegion)
	}
	return &Region{
		Node: node, Name: name, Addr: binary.LittleEndian.Uint64(resp[1:]), rkey: binary.LittleEndian.Uint32(resp[9:]),
		Len: binary.LittleEndian.Uint64(resp[13:]), Access: verbs.Access(binary.LittleEndian.Uint32(resp[21:])),
	}, nil
}

var errRCRefused = errors.New("core: peer refused the RC connection")

// Region learns the region named name on the node the queue is connected
// to (see Runtime.Region).
func (q *Queue) Region(ctx context.Context, name string) (*Region, error) {
	q.mu.Lock()
	p := q.peer
	q.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("core: region %q: %w", name, ErrNotConnected)
	}
	return q.rt.Region(ctx, p.node, name)
}
