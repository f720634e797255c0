package remotedev

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// pd is a proxied protection domain.
type pd struct {
	c *Client
	h uint64
}

// RegMR registers buf on the server. buf must lie in an offheap.AllocShared
// block: the server maps the same memfd and registers its own view of it.
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	ref, err := describe(buf)
	if err != nil {
		return nil, err
	}
	unpin, err := offheap.Pin(buf)
	if err != nil {
		return nil, fmt.Errorf("remote reg MR: %w", err)
	}
	resp, err := p.c.call(&request{Op: opRegMR, H: p.h, Mem: ref, Access: access})
	if err == nil && resp.MR == nil {
		err = fmt.Errorf("remote reg MR: server sent no region: %w", verbs.ErrInvalid)
	}
	if err != nil {
		unpin()
		return nil, err
	}
	m := &mr{c: p.c, h: resp.H, info: *resp.MR, buf: buf}
	p.c.pin(m, unpin)
	return m, nil
}

// describe names buf's memfd, range and identity for the server.
func describe(buf []byte) (*memRef, error) {
	blk, off, err := offheap.Find(buf)
	if err != nil {
		return nil, fmt.Errorf("remote reg MR: %d bytes: %w (%w)", len(buf), err, verbs.ErrInvalid)
	}
	if blk.FD() < 0 {
		return nil, fmt.Errorf("remote reg MR: private memory cannot be shared with the server, use offheap.AllocShared: %w (%w)",
			offheap.ErrNotOffHeap, verbs.ErrInvalid)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(blk.FD(), &st); err != nil {
		return nil, fmt.Errorf("remote reg MR: stat memfd %d: %w", blk.FD(), err)
	}
	return &memRef{PID: pid, FD: blk.FD(), Dev: uint64(st.Dev), Ino: st.Ino,
		Size: blk.Len(), Off: off, Len: len(buf)}, nil
}

// CreateQP creates a QP on the server. Its CQs and SRQ must come from the
// same Client.
func (p *pd) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	wi, err := p.c.qpInit(init)
	if err != nil {
		return nil, err
	}
	resp, err := p.c.call(&request{Op: opCreateQP, H: p.h, QPInit: wi})
	if err == nil && resp.QP == nil {
		err = fmt.Errorf("remote create QP: server sent no QP: %w", verbs.ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	return &qp{c: p.c, h: resp.H, num: resp.QP.Num, typ: resp.QP.Type}, nil
}

func (c *Client) qpInit(init verbs.QPInit) (*qpInit, error) {
	send, err := c.handleOf(init.SendCQ, "send CQ")
	if err != nil {
		return nil, err
	}
	recv, err := c.handleOf(init.RecvCQ, "receive CQ")
	if err != nil {
		return nil, err
	}
	srqH, err := c.handleOf(init.SRQ, "SRQ")
	if err != nil {
		return nil, err
	}
	return &qpInit{Type: init.Type, SendCQ: send, RecvCQ: recv, SRQ: srqH,
		Cap: init.Cap, SignalAll: init.SignalAll, DCKey: init.DCKey}, nil
}

// handleOf maps an object this client made to its server handle, and nil to
// 0 (the server passes nil on and its provider judges). An object from any
// other device cannot be named on the server.
func (c *Client) handleOf(v any, what string) (uint64, error) {
	var owner *Client
	var h uint64
	switch o := v.(type) {
	case nil:
		return 0, nil
	case *cq:
		owner, h = o.c, o.h
	case *srq:
		owner, h = o.c, o.h
	case *ah:
		owner, h = o.c, o.h
	}
	if owner != c || h == 0 {
		return 0, fmt.Errorf("remote: %s %T is not from this device: %w", what, v, verbs.ErrInvalid)
	}
	return h, nil
}

// CreateSRQ creates a shared receive queue on the server.
func (p *pd) CreateSRQ(init verbs.SRQInit) (verbs.SRQ, error) {
	resp, err := p.c.call(&request{Op: opCreateSRQ, H: p.h, SRQInit: &init})
	if err != nil {
		return nil, err
	}
	return &srq{c: p.c, h: resp.H}, nil
}

// CreateAH creates an address handle on the server.
func (p *pd) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	resp, err := p.c.call(&request{Op: opCreateAH, H: p.h, AHAttr: &attr})
	if err != nil {
		return nil, err
	}
	a := &ah{c: p.c, h: resp.H, dest: attr.Dest}
	if resp.Dest != nil {
		a.dest = *resp.Dest
	}
	return a, nil
}

// Close deallocates the PD on the server.
func (p *pd) Close() error { return p.c.closeHandle(p.h) }

// mr is a proxied registration: keys and address are the server's, the
// bytes are the client's view of the same pages.
type mr struct {
	c    *Client
	h    uint64
	info mrInfo
	buf  []byte
}

// LKey is the server's local key.
func (m *mr) LKey() uint32 { return m.info.LKey }

// RKey is the server's remote key.
func (m *mr) RKey() uint32 { return m.info.RKey }

// Addr is the region's address in the server's mapping, the one its RNIC
// resolves SGEs and remote operations against.
func (m *mr) Addr() uint64 { return m.info.Addr }

// Len is the region's length.
func (m *mr) Len() int { return m.info.Len }

// Bytes is the client's own view of the registered pages.
func (m *mr) Bytes() []byte { return m.buf }

// Access is the region's access flags.
func (m *mr) Access() verbs.Access { return m.info.Access }

// Close deregisters on the server, then releases the client block's pin.
// If the server is gone, or the registration already is (ErrClosed: its
// device was closed, which destroys what was made from it), the pin goes
// too.
func (m *mr) Close() error {
	err := m.c.closeHandle(m.h)
	if err == nil || errors.Is(err, verbs.ErrClosed) || m.c.connLost(err) {
		m.c.unpin(m)
	}
	return err
}

// cq is a proxied completion queue.
type cq struct {
	c   *Client
	h   uint64
	cap int
}

// maxPoll bounds one Poll's reply; Poll may return fewer than asked.
const maxPoll = 4096

// Poll polls the server's CQ for up to len(wc) completions.
func (q *cq) Poll(wc []verbs.WC) (int, error) {
	resp, err := q.c.call(&request{Op: opPoll, H: q.h, N: min(len(wc), maxPoll)})
	if resp == nil {
		return 0, err
	}
	return copy(wc, resp.WC), err
}

// Wait waits on the server in slices of at most WaitSlice, so ctx is
// honoured even though the server cannot see it.
func (q *cq) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := q.c.opt.WaitSlice
		if dl, ok := ctx.Deadline(); ok {
			slice = max(min(slice, time.Until(dl)), time.Millisecond)
		}
		resp, err := q.c.callCtx(ctx, &request{Op: opWait, H: q.h, Timeout: slice}, slice)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if resp.Ready {
			return nil
		}
	}
}

// Cap is the capacity the server's CQ was created with.
func (q *cq) Cap() int { return q.cap }

// Close destroys the CQ on the server.
func (q *cq) Close() error { return q.c.closeHandle(q.h) }

// qp is a proxied queue pair.
type qp struct {
	c   *Client
	h   uint64
	num uint32
	typ verbs.QPType
}

// Num is the server's QP number, the one peers and completions use.
func (q *qp) Num() uint32 { return q.num }

// Type is the QP's transport.
func (q *qp) Type() verbs.QPType { return q.typ }

// State asks the server. A QP whose server is unreachable is reported in
// ERR, which is what it is to its peers.
func (q *qp) State() verbs.QPState {
	resp, err := q.c.call(&request{Op: opQPState, H: q.h})
	if err != nil {
		return verbs.StateErr
	}
	return resp.State
}

// Endpoint asks the server; the zero Endpoint if it cannot be reached.
func (q *qp) Endpoint() verbs.Endpoint {
	resp, err := q.c.call(&request{Op: opQPEndpoint, H: q.h})
	if err != nil || resp.Endpoint == nil {
		return verbs.Endpoint{}
	}
	return *resp.Endpoint
}

// Modify applies a state change on the server.
func (q *qp) Modify(attr verbs.QPAttr) error {
	_, err := q.c.call(&request{Op: opModify, H: q.h, QPAttr: &attr})
	return err
}

// PostSend posts on the server. A request whose AH is not from this client
// is refused here, after the ones before it were posted.
func (q *qp) PostSend(wr []verbs.SendWR) (int, error) {
	ws := make([]sendWR, 0, len(wr))
	var bad error
	for i := range wr {
		h, err := q.c.handleOf(wr[i].AH, "AH")
		if err != nil {
			bad = fmt.Errorf("remote post send: work request %d: %w", i, err)
			break
		}
		ws = append(ws, toWire(&wr[i], h))
	}
	if len(ws) > 0 || bad == nil {
		resp, err := q.c.call(&request{Op: opPostSend, H: q.h, Send: ws})
		if err != nil || bad == nil {
			return accepted(resp), err
		}
	}
	return len(ws), bad
}

// PostRecv posts receives on the server.
func (q *qp) PostRecv(wr []verbs.RecvWR) (int, error) {
	resp, err := q.c.call(&request{Op: opPostRecv, H: q.h, Recv: wr})
	return accepted(resp), err
}

func accepted(resp *response) int {
	if resp == nil {
		return 0
	}
	return resp.N
}

// Close destroys the QP on the server.
func (q *qp) Close() error { return q.c.closeHandle(q.h) }

// srq is a proxied shared receive queue.
type srq struct {
	c *Client
	h uint64
}

// PostRecv posts receives on the server's SRQ.
func (s *srq) PostRecv(wr []verbs.RecvWR) (int, error) {
	resp, err := s.c.call(&request{Op: opSRQPostRecv, H: s.h, Recv: wr})
	return accepted(resp), err
}

// Close destroys the SRQ on the server.
func (s *srq) Close() error { return s.c.closeHandle(s.h) }

// ah is a proxied address handle.
type ah struct {
	c    *Client
	h    uint64
	dest verbs.Endpoint
}

// Dest is the port the handle names, as the server's device reported it.
func (a *ah) Dest() verbs.Endpoint { return a.dest }

// Close destroys the AH on the server.
func (a *ah) Close() error { return a.c.closeHandle(a.h) }
