package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/internal/udrpc"
	"github.com/krcore/krcore/verbs"
)

// Control messages travel between runtimes over UD (package udrpc), to the
// control QP every node publishes in its MetaServer record, so they need
// neither DC nor a connection: they are how RC connections are set up.
// Each is a type byte, a request id (8 bytes, little-endian), the sender's
// node (8), its control QKey (4), its control endpoint (a length byte and a
// marshalled verbs.Endpoint, where replies go) and a body. Requests have odd types,
// replies the request's type + 1.
const (
	ctlRegionReq = iota + 1 // body: the asker's port (4), region name
	ctlRegionResp
	ctlRCReq // body: marshalled verbs.Endpoint of the caller's new RC QP
	ctlRCResp
	ctlRCClose // body: the closing side's QPN (4) and the receiver's QPN (4)
	ctlRCCloseResp
	ctlRCReady // body: the caller's QPN (4) and the receiver's QPN (4)
	ctlRCReadyResp
	ctlPing // no body: are you there? (see probe)
	ctlPingResp
	ctlRCIdle // body as ctlRCClose: how long has your end been idle? (see peerIdle)
	ctlRCIdleResp
)

// Control limits and timing. A first attempt waits ctlTimeout for its
// reply, each retry twice as long.
const (
	ctlMax      = 512
	ctlTimeout  = 20 * time.Millisecond
	ctlAttempts = 8
	ctlQueue    = 256 // requests waiting to be served; past it they are dropped (and retried)
	// maxName bounds an export's name, so that a region lookup for it fits
	// a control message with room to spare.
	maxName = 200
)

// control serves this node's control QP (region lookups and RC set-up for
// other nodes) and makes this node's own calls.
type control struct {
	rt     *Runtime
	ep     *udrpc.Endpoint
	qkey   uint32
	self   []byte // our control endpoint, length-prefixed, as every message carries it
	selfEP verbs.Endpoint
	nextID atomic.Uint64

	mu   sync.Mutex
	reqs [][]byte      // requests received, not yet served
	work chan struct{} // a token: reqs is not empty
}

func newControl(rt *Runtime) (*control, error) {
	c := &control{rt: rt, qkey: uint32(nonce.Uint64()) & 0x7fffffff, work: make(chan struct{}, 1)}
	c.nextID.Store(nonce.Uint64())
	ep, err := udrpc.New(rt.dev, rt.pd, udrpc.Config{
		QKey: c.qkey, MaxMsg: ctlMax, Timeout: ctlTimeout, Attempts: ctlAttempts,
		ReplyID: ctlReplyID, OnRequest: c.enqueue, Closed: krcore.ErrClosed,
	})
	if err != nil {
		return nil, fmt.Errorf("control QP: %w", err)
	}
	c.ep = ep
	port := rt.dev.Port()
	c.selfEP = verbs.Endpoint{Addr: port.Addr, GID: port.GID, LID: port.LID, QPN: ep.QPN()}
	self, _ := c.selfEP.MarshalBinary()
	c.self = binary.LittleEndian.AppendUint32(nil, c.qkey)
	c.self = append(append(c.self, byte(len(self))), self...)
	rt.wg.Add(1)
	go c.serve()
	return c, nil
}

// ctlReplyID tells replies (even types) and the call they answer.
func ctlReplyID(msg []byte) (uint64, bool) {
	if len(msg) < 9 || msg[0]%2 != 0 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(msg[1:]), true
}

// enqueue keeps a request for the serving goroutine; the endpoint's
// poller calls it and it must not block.
func (c *control) enqueue(msg []byte) {
	c.mu.Lock()
	if len(c.reqs) < ctlQueue {
		c.reqs = append(c.reqs, msg)
	}
	c.mu.Unlock()
	select {
	case c.work <- struct{}{}:
	default:
	}
}

// serve handles control requests until the runtime stops. Between
// requests it polls the control QP (or waits for a caller that does).
func (c *control) serve() {
	defer c.rt.wg.Done()
	ctx, cancel := c.rt.untilStop()
	defer cancel()
	for {
		if err := c.ep.Wait(ctx, c.work); err != nil {
			return
		}
		c.mu.Lock()
		reqs := c.reqs
		c.reqs = nil
		c.mu.Unlock()
		for _, m := range reqs {
			hctx, hcancel := context.WithTimeout(ctx, c.rt.retryTimeout())
			c.handle(hctx, m)
			hcancel()
		}
	}
}

// ctlMsg is a parsed control message.
type ctlMsg struct {
	typ  byte
	id   uint64
	from krcore.NodeID
	qkey uint32         // the sender's control QKey
	back verbs.Endpoint // the sender's control endpoint
	body []byte
}

// ctlHdr is the fixed part of a control message, up to the endpoint.
const ctlHdr = 1 + 8 + 8 + 4 + 1

func parseCtl(b []byte) (ctlMsg, bool) {
	if len(b) < ctlHdr || len(b) < ctlHdr+int(b[ctlHdr-1]) {
		return ctlMsg{}, false
	}
	le := binary.LittleEndian
	m := ctlMsg{typ: b[0], id: le.Uint64(b[1:]), from: le.Uint64(b[9:]), qkey: le.Uint32(b[17:])}
	n := int(b[ctlHdr-1])
	if m.back.UnmarshalBinary(b[ctlHdr:ctlHdr+n]) != nil {
		return ctlMsg{}, false
	}
	m.body = b[ctlHdr+n:]
	return m, true
}

// encode frames a control message from this node.
func (c *control) encode(typ byte, id uint64, body []byte) ([]byte, error) {
	b := make([]byte, 0, 17+len(c.self)+len(body))
	b = append(b, typ)
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint64(b, c.rt.node)
	b = append(append(b, c.self...), body...)
	if len(b) > ctlMax {
		return nil, fmt.Errorf("core: control message of %d bytes: %w", len(b), verbs.ErrLimit)
	}
	return b, nil
}

func (c *control) handle(ctx context.Context, raw []byte) {
	m, ok := parseCtl(raw)
	if !ok {
		return
	}
	c.rt.heardFrom(ctx, m.from, m.back)
	var resp []byte
	switch m.typ {
	case ctlPing:
		resp = []byte{0}
	case ctlRegionReq:
		resp = c.rt.describeRegion(m.from, m.body)
	case ctlRCReq:
		resp = c.rt.acceptRC(ctx, m.from, m.body)
	case ctlRCClose:
		resp = c.rt.closeRC(m.from, m.body)
	case ctlRCIdle:
		resp = c.rt.idleRC(m.from, m.body)
	case ctlRCReady:
		resp = c.rt.readyRC(m.from, m.body)
	default:
		return
	}
	if err := c.reply(ctx, m, resp); err != nil {
		c.rt.log.Warn("control reply failed", "to", m.from, "type", m.typ, "err", err)
	}
}

// reply answers m at the endpoint it came from.
func (c *control) reply(ctx context.Context, m ctlMsg, body []byte) error {
	ah, err := c.rt.addressHandle(m.back)
	if err != nil {
		return err
	}
	b, err := c.encode(m.typ+1, m.id, body)
	if err != nil {
		return err
	}
	return c.ep.Send(ctx, udrpc.Dest{AH: ah, QPN: m.back.QPN, QKey: m.qkey}, b)
}

// call sends a control request to node and waits for its reply. A node
// that does not answer may have restarted with a new control QP: its
// record is refetched and, if it changed, the call made again.
func (c *control) call(ctx context.Context, node krcore.NodeID, typ byte, body []byte) ([]byte, error) {
	p, err := c.rt.peerFor(ctx, node)
	if err != nil {
		return nil, err
	}
	if err := p.deadErr(); err != nil {
		return nil, fmt.Errorf("core: control call to node %d: %w", node, err)
	}
	resp, err := c.callPeer(ctx, p, typ, body)
	if peerSilent(err) {
		if changed, rerr := p.refresh(ctx); rerr == nil && changed {
			resp, err = c.callPeer(ctx, p, typ, body)
		}
		if peerSilent(err) {
			c.rt.confirmDead(p, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("core: control call to node %d: %w", node, err)
	}
	return resp, nil
}

// pingSelf asks this runtime's own control QP for an answer: one shows
// that the runtime ran its control path (sent, served and received) while
// the call lasted.
func (c *control) pingSelf(ctx context.Context) error {
	ah, err := c.rt.addressHandle(c.selfEP)
	if err != nil {
		return err
	}
	id := c.nextID.Add(1)
	b, err := c.encode(ctlPing, id, nil)
	if err != nil {
		return err
	}
	_, err = c.ep.Call(ctx, udrpc.Dest{AH: ah, QPN: c.selfEP.QPN, QKey: c.qkey}, id, b)
	return err
}

func (c *control) callPeer(ctx context.Context, p *peer, typ byte, body []byte) ([]byte, error) {
	t := p.target()
	if t.ctrlQPN == 0 {
		return nil, fmt.Errorf("node %d has no control QP: %w", p.node, krcore.ErrUnreachable)
	}
	id := c.nextID.Add(1)
	b, err := c.encode(typ, id, body)
	if err != nil {
		return nil, err
	}
	rep, err := c.ep.Call(ctx, udrpc.Dest{AH: t.ah, QPN: t.ctrlQPN, QKey: t.ctrlQKey}, id, b)
	if err != nil {
		return nil, err
	}
	m, ok := parseCtl(rep)
	if !ok || m.typ != typ+1 {
		return nil, fmt.Errorf("malformed reply of type %d to a request of type %d: %w", m.typ, typ, verbs.ErrInvalid)
	}
	return m.body, nil
}

// export is a region this node offers under a name: its own MR over
// exactly the exported bytes with exactly the exported rights, so the rkey
// a client learns reaches nothing else of mr, whatever the client does
// with it; the RNIC refuses the rest with REM_ACCESS_ERR.
type export struct {
	mr  *MR      // the MR it was exported from
	reg verbs.MR // the export's own registration
	// to is its audience: the principals a lookup must come from; none
	// is every node and process.
	to []krcore.Principal
}

// Export offers n bytes at offset off of mr under name, with the remote
// access given (a subset of the MR's), to every node, or only to the
// principals to (see krcore.API.Export). A client learns it with Region;
// Unexport or Deregister revokes it.
func (rt *Runtime) Export(name string, h krcore.MR, off, n int, access verbs.Access, to ...krcore.Principal) error {
	if err := rt.closedErr(fmt.Sprintf("export %q", name)); err != nil {
		return err
	}
	mr := rt.ownMR(h)
	if mr == nil {
		return fmt.Errorf("core: export %q from an MR of another runtime: %w", name, krcore.ErrRefused)
	}
	if name == "" || len(name) > maxName || off < 0 || n <= 0 || off > mr.Len() || n > mr.Len()-off {
		return fmt.Errorf("core: export %q [%d,+%d) of a %d-byte MR: %w", name, off, n, mr.Len(), verbs.ErrInvalid)
	}
	if err := checkAudience(to); err != nil {
		return fmt.Errorf("core: export %q: %w", name, err)
	}
	remote := verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	if access&^remote != 0 || access&^mr.access != 0 {
		return fmt.Errorf("core: export %q with %s from an MR with %s: %w", name, access, mr.access, verbs.ErrInvalid)
	}
	// Remote writes need LOCAL_WRITE on the registration (as verbs
	// requires); the MR has it when it has them, and the export's lkey
	// never leaves the runtime.
	buf := mr.Bytes()
	if buf == nil { // Deregister released it meanwhile
		return fmt.Errorf("core: export %q from a deregistered MR: %w", name, krcore.ErrClosed)
	}
	reg, err := rt.pd.RegMR(buf[off:off+n], access|mr.access&verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("core: export %q: register [%d,+%d): %w", name, off, n, err)
	}
	rt.mu.Lock()
	switch _, dup := rt.exports[name]; {
	case rt.closed: // Close began after the check above and will not see it
		err = fmt.Errorf("core: export %q: runtime: %w", name, krcore.ErrClosed)
	case dup:
		err = fmt.Errorf("core: export %q: name taken: %w", name, verbs.ErrBusy)
	case !mr.live(): // Deregister withdraws mr's exports after marking it
		err = fmt.Errorf("core: export %q from a deregistered MR: %w", name, krcore.ErrClosed)
	default:
		rt.exports[name] = &export{mr: mr, reg: reg, to: slices.Clone(to)}
	}
	rt.mu.Unlock()
	if err != nil {
		reg.Close()
	}
	return err
}

// Unexport withdraws a name and revokes it: its registration goes, so
// clients that learned it get REM_ACCESS_ERR from now on. The memory stays
// the caller's MR's. A name the runtime does not export is refused
// (ErrRefused), as krcored refuses a client a name it did not export; a
// closed runtime, which revoked every name, fails with ErrClosed.
func (rt *Runtime) Unexport(name string) error {
	rt.mu.Lock()
	if rt.closed { // Close revokes what is left
		rt.mu.Unlock()
		return fmt.Errorf("core: unexport %q: runtime: %w", name, krcore.ErrClosed)
	}
	e := rt.exports[name]
	delete(rt.exports, name)
	rt.mu.Unlock()
	if e == nil {
		return fmt.Errorf("core: unexport %q: not exported by this runtime: %w", name, krcore.ErrRefused)
	}
	e.revoke()
	return nil
}

// revoke deregisters the export. The RNIC finishes an operation copying
// through it first (as verbs' dereg_mr does), and a later one fails.
func (e *export) revoke() {
	// ErrClosed: the device closed first (a node killed) and took the
	// registration with it, which is what revoking wants.
	if err := e.reg.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
		e.mr.rt.log.Warn("revoke export", "err", err)
	}
}

// unexportMR revokes every export of m.
func (rt *Runtime) unexportMR(m *MR) {
	var gone []*export
	rt.mu.Lock()
	for name, e := range rt.exports {
		if e.mr == m {
			delete(rt.exports, name)
			gone = append(gone, e)
		}
	}
	rt.mu.Unlock()
	for _, e := range gone {
		e.revoke()
	}
}

// checkAudience refuses principals no queue can be: node or port 0, a
// reserved port (as Bind refuses it); and more than krcore.MaxAudience.
func checkAudience(to []krcore.Principal) error {
	if len(to) > krcore.MaxAudience {
		return fmt.Errorf("audience of %d principals, more than %d: %w", len(to), krcore.MaxAudience, verbs.ErrLimit)
	}
	for _, p := range to {
		if p.Node == 0 || p.Port == 0 || p.Port&portHasImm != 0 {
			return fmt.Errorf("audience principal node %d port %#x: %w", p.Node, p.Port, verbs.ErrInvalid)
		}
	}
	return nil
}

// admits reports whether asker may learn the export.
func (e *export) admits(asker krcore.Principal) bool {
	return len(e.to) == 0 || slices.Contains(e.to, asker)
}

// describeRegion answers a region lookup from node from, as port (4 bytes
// of body, then the name): status (1 byte; 0 found), then address, rkey,
// length and access of the export's own registration. A name not exported
// to the asker is answered as one not exported at all, so a lookup tells
// an outsider nothing.
func (rt *Runtime) describeRegion(from krcore.NodeID, body []byte) []byte {
	if len(body) < 4 {
		return []byte{1}
	}
	asker := krcore.Principal{Node: from, Port: binary.LittleEndian.Uint32(body)}
	rt.mu.Lock()
	e := rt.exports[string(body[4:])]
	rt.mu.Unlock()
	if e == nil || !e.mr.live() || !e.admits(asker) {
		return []byte{1}
	}
	b := make([]byte, 1, 25)
	b = binary.LittleEndian.AppendUint64(b, e.reg.Addr())
	b = binary.LittleEndian.AppendUint32(b, e.reg.RKey())
	b = binary.LittleEndian.AppendUint64(b, uint64(e.reg.Len()))
	remote := verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	return binary.LittleEndian.AppendUint32(b, uint32(e.reg.Access()&remote))
}

// Region learns the region node exports under name, asking as no port (a
// region exported to an audience is not found; see Queue.Region). A name
// longer than any export's is refused (ErrInvalid) without asking.
func (rt *Runtime) Region(ctx context.Context, node krcore.NodeID, name string) (*Region, error) {
	return rt.region(ctx, node, name, 0)
}

// region asks node for the region it exports under name as port of this
// node, which the caller vouches a queue of this runtime holds.
func (rt *Runtime) region(ctx context.Context, node krcore.NodeID, name string, port uint32) (*Region, error) {
	if len(name) > maxName {
		return nil, fmt.Errorf("core: region name of %d bytes, longer than an export's %d: %w", len(name), maxName, verbs.ErrInvalid)
	}
	body := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(name)), port)
	resp, err := rt.ctrl.call(ctx, node, ctlRegionReq, append(body, name...))
	if err != nil {
		return nil, fmt.Errorf("core: region %q of node %d: %w", name, node, err)
	}
	if len(resp) != 25 || resp[0] != 0 {
		return nil, fmt.Errorf("core: region %q of node %d: %w", name, node, krcore.ErrNoRegion)
	}
	le := binary.LittleEndian
	return &Region{g: &grant{
		rt: rt, node: node, name: name, addr: le.Uint64(resp[1:]), rkey: le.Uint32(resp[9:]),
		len: le.Uint64(resp[13:]), access: verbs.Access(le.Uint32(resp[21:])),
	}}, nil
}

var errRCRefused = errors.New("core: peer refused the RC connection")

// Region learns the region named name on the node the queue is connected
// to, asking as this node and the port the queue holds bound (0 if none):
// the runtime vouches only for a port one of its queues holds, so a
// region exported to an audience is found only by its principals. A
// closed queue fails with ErrClosed.
func (q *Queue) Region(ctx context.Context, name string) (krcore.Region, error) {
	q.mu.Lock()
	p, closed := q.peer, q.closed
	q.mu.Unlock()
	switch {
	case closed: // its port, which the lookup would ask as, is gone
		return nil, fmt.Errorf("core: region %q: queue: %w", name, krcore.ErrClosed)
	case p == nil:
		return nil, fmt.Errorf("core: region %q: %w", name, krcore.ErrNotConnected)
	}
	g, err := q.rt.region(ctx, p.node, name, q.port.Load())
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return g, nil
}
