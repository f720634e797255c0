// Package kernellink is the Go end of SMC-Rv2 link groups toward Linux
// kernel AF_SMC peers, on any verbs device (the ibverbs provider on rxe
// or a RoCE NIC), as server or client, carrying any number of
// connections:
//
//   - Endpoint.Accept answers a kernel client's CLC proposal: with a new
//     link group (first contact: an RC QP, LLCv2 CONFIRM_LINK both ways)
//     or, when one toward that peer is up, with a connection on it (no
//     first contact: the kernel then confirms the new buffer's rkey with
//     CONFIRM_RKEY, answered here);
//   - Endpoint.Dial proposes to a kernel server and follows its choice
//     the same way.
//
// A group's poller goroutine takes every completion: CDC messages move
// their connection's cursors; TEST_LINK, CONFIRM_RKEY and DELETE_RKEY are
// answered; an ADD_LINK request is declined as the kernel's own client
// declines one it cannot serve (reject, no alternate path), so the group
// stays at one link; DELETE_LINK, or a failed completion, ends the group
// and aborts its connections. Conn is a connection's data path: RDMA
// WRITEs into the peer's buffer and CDC messages, the consumer cursor
// returned as the kernel's rule says. A group whose last connection is
// gone lingers for Config.Linger (a next connection reuses it), then
// sends DELETE_LINK (orderly, all links), so the kernel frees its side
// at once.
package kernellink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// Config is this side's identity and device toward kernel peers.
type Config struct {
	// Device is the RDMA device whose port carries the TCP connections'
	// local address (its GID is the IPv4-mapped one of that address).
	Device verbs.Device
	// MAC is the hardware address of the network device under Device.
	MAC net.HardwareAddr
	// SystemID names this host to the peer; the kernel finds the link
	// group a connection may reuse by it.
	SystemID [8]byte
	// Hostname goes into the first-contact extension.
	Hostname string
	// EID is the user EID proposed (Dial) and required in a proposal
	// (Accept): the kernel offers SMC-Rv2 only with a UEID both share.
	EID smcr.EID
	// MaxLinks is what a proposal offers (1 or 2; 0 is 2, the kernel's
	// own): with 2 a kernel server that has a second device sends
	// ADD_LINK, which is declined.
	MaxLinks uint8
	// Linger is how long a group without connections stays up for the
	// next one; 0 or less ends it at once.
	Linger time.Duration
}

// Errors of a connection or group.
var (
	// ErrClosed: the connection or endpoint was closed by this side; it
	// matches net.ErrClosed, as a closed net.Conn's errors do.
	ErrClosed = fmt.Errorf("kernellink: closed: %w", net.ErrClosed)
	// ErrAborted: the peer aborted the connection or the link group
	// ended under it; it matches syscall.ECONNRESET.
	ErrAborted = fmt.Errorf("kernellink: connection aborted: %w", syscall.ECONNRESET)
	// ErrPeerClosed: a write after the peer closed the connection; it
	// matches syscall.EPIPE.
	ErrPeerClosed = fmt.Errorf("kernellink: the peer closed the connection: %w", syscall.EPIPE)
	// ErrWriteShut: a write after CloseWrite.
	ErrWriteShut = errors.New("kernellink: write after CloseWrite")
	// ErrDeclined is matched by a Declined.
	ErrDeclined = errors.New("kernellink: declined")
)

// The buffers and limits: each connection's receive buffer (RMB) of
// rmbSize, LLC receive buffers of the size the kernel's v2 messages may
// take, as many as the kernel posts, and send slots for the small SENDs
// (CDC and LLC), each covering the WRITEs posted before it.
const (
	rmbSize     = 64 << 10
	rmbSizeComp = 2 // 16 KiB << 2
	llcBufSize  = 8 << 10
	llcRecvs    = 48
	slots       = 64
	slotSize    = 1024
	wrsPerSlot  = 4 // at most 2 WRITEs (one ring wrap) and the SEND
	mtuEnum     = 3 // IB MTU 1024: rxe's default path MTU
	mtuBytes    = 1024
	linkNum     = 1
)

// Group is one link group toward a kernel peer: one RC QP, the
// connections on it by their alert token, and the poller that serves it.
type Group struct {
	ep      *Endpoint
	server  bool
	peerID  [8]byte
	peerGID [16]byte
	peerQPN uint32

	pd      verbs.PD
	cq      verbs.CQ
	qp      verbs.QP
	llc, tx verbs.MR
	mrs     []verbs.MR // the regions, each over its block of mem
	mem     []*offheap.Block

	slotFree chan int
	slotSGE  [slots]verbs.SGE // each slot's SEND's one SGE, its slot's owner's
	recvWR   [1]verbs.RecvWR  // the poller's scratch for reposting a receive
	recvSGE  [1]verbs.SGE
	llcIn    chan []byte // LLC messages the poller does not answer itself
	stop     context.CancelFunc
	polled   chan struct{} // closed when the poller returned

	mu        sync.Mutex
	use       [slots]slotUse
	pending   [][]byte // answers the poller could not send for want of a slot
	conns     map[uint32]*Conn
	nextToken uint32
	err       error // why the group ended; nil while up
	idle      *time.Timer
	confirmed bool // CONFIRM_LINK done: DELETE_LINK is due at the end
}

// slotUse is what a send slot's completion settles.
type slotUse struct {
	conn *Conn
	fin  uint64        // the conn's bytes written up to this SEND
	done chan struct{} // closed on completion (DELETE_LINK's wait)
}

// newGroup makes a group's QP and buffers on the endpoint's device.
func newGroup(ep *Endpoint, server bool) (*Group, error) {
	g := &Group{ep: ep, server: server, slotFree: make(chan int, slots), llcIn: make(chan []byte, 8),
		conns: map[uint32]*Conn{}, polled: make(chan struct{})}
	for i := range slots {
		g.slotFree <- i
	}
	if err := g.setup(ep.cfg.Device); err != nil {
		close(g.polled)
		g.destroy()
		return nil, err
	}
	return g, nil
}

func (g *Group) setup(dev verbs.Device) error {
	var err error
	if g.pd, err = dev.AllocPD(); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	if g.cq, err = dev.CreateCQ(slots*wrsPerSlot + llcRecvs); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	g.qp, err = g.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: g.cq, RecvCQ: g.cq,
		Cap: verbs.QPCap{MaxSendWR: slots * wrsPerSlot, MaxRecvWR: llcRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	if g.llc, err = g.region(llcRecvs*llcBufSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	g.tx, err = g.region(slots*slotSize, verbs.AccessLocalWrite)
	return err
}

// region allocates and registers n bytes in the group's PD.
func (g *Group) region(n int, a verbs.Access) (verbs.MR, error) {
	b, err := offheap.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("kernellink: %w", err)
	}
	mr, err := g.pd.RegMR(b.Bytes(), a)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("kernellink: registering %d bytes: %w", n, err)
	}
	g.mu.Lock()
	g.mrs, g.mem = append(g.mrs, mr), append(g.mem, b)
	g.mu.Unlock()
	return mr, nil
}

// up connects the QP to the kernel's, posts the receives and starts the
// poller.
func (g *Group) up(peer *smcr.AcceptConfirm) error {
	remote := verbs.Endpoint{GID: verbs.GID(peer.GID), QPN: peer.QPN, PSN: peer.PSN}
	if err := verbs.Connect(g.qp, remote, verbs.Path{MTU: mtuBytes}); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	rwr := make([]verbs.RecvWR, llcRecvs)
	for i := range rwr {
		rwr[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{verbs.SGEOf(g.llc, i*llcBufSize, llcBufSize)}}
	}
	if _, err := g.qp.PostRecv(rwr); err != nil {
		return fmt.Errorf("kernellink: posting LLC receives: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.stop = cancel
	go g.poll(ctx) // owned by g: close stops it
	return nil
}

// local is this side's QP endpoint.
func (g *Group) local() verbs.Endpoint { return g.qp.Endpoint() }

// awaitLLC waits for an LLC message the poller passed on.
func (g *Group) awaitLLC(ctx context.Context) (smcr.LLCMessage, error) {
	select {
	case b := <-g.llcIn:
		return smcr.DecodeLLC(b)
	case <-g.polled:
		return nil, g.failure()
	case <-ctx.Done():
		return nil, fmt.Errorf("kernellink: waiting for an LLC message: %w", ctx.Err())
	}
}

// confirmServer runs CONFIRM_LINK as the server: our request first, the
// kernel answers.
func (g *Group) confirmServer(ctx context.Context) error {
	ep := g.local()
	req := &smcr.ConfirmLink{Version: 2, Flags: smcr.LLCFlagNoRMBEEyeC, SenderGID: [16]byte(ep.GID),
		SenderQPN: ep.QPN, LinkNum: linkNum, LinkUID: [4]byte{'k', 'r', 'c', 1}, MaxLinks: 1, MaxConns: 255}
	copy(req.SenderMAC[:], g.ep.cfg.MAC)
	if err := g.send(ctx, req.Append(nil), slotUse{}); err != nil {
		return err
	}
	msg, err := g.awaitLLC(ctx)
	if err != nil {
		return err
	}
	if resp, ok := msg.(*smcr.ConfirmLink); !ok || resp.Flags&smcr.LLCFlagResp == 0 {
		return fmt.Errorf("kernellink: %T (%+v) where the CONFIRM_LINK response belongs", msg, msg)
	}
	g.mu.Lock()
	g.confirmed = true
	g.mu.Unlock()
	return nil
}

// confirmClient waits for the server's CONFIRM_LINK request and answers
// it.
func (g *Group) confirmClient(ctx context.Context) error {
	msg, err := g.awaitLLC(ctx)
	if err != nil {
		return err
	}
	req, ok := msg.(*smcr.ConfirmLink)
	if !ok || req.Flags&smcr.LLCFlagResp != 0 {
		return fmt.Errorf("kernellink: %T (%+v) where the server's CONFIRM_LINK belongs", msg, msg)
	}
	ep := g.local()
	resp := &smcr.ConfirmLink{Version: 2, Flags: smcr.LLCFlagResp | req.Flags, SenderGID: [16]byte(ep.GID),
		SenderQPN: ep.QPN, LinkNum: req.LinkNum, LinkUID: [4]byte{'k', 'r', 'c', 2},
		MaxLinks: req.MaxLinks, MaxConns: req.MaxConns}
	copy(resp.SenderMAC[:], g.ep.cfg.MAC)
	if err := g.send(ctx, resp.Append(nil), slotUse{}); err != nil {
		return err
	}
	g.mu.Lock()
	g.confirmed = true
	g.mu.Unlock()
	return nil
}

// send SENDs b from a send slot (waiting for one under ctx), after the
// WRITEs wrs; u is settled when the SEND completes.
func (g *Group) send(ctx context.Context, b []byte, u slotUse, wrs ...verbs.SendWR) error {
	var slot int
	select {
	case slot = <-g.slotFree:
	case <-g.polled:
		return g.failure()
	case <-ctx.Done():
		return fmt.Errorf("kernellink: waiting for a send slot: %w", ctx.Err())
	}
	return g.post(slot, b, u, wrs)
}

// trySend is send for the poller: it cannot wait for a slot (only it
// frees them), so an answer without one waits in pending for the next
// completion.
func (g *Group) trySend(b []byte) {
	select {
	case slot := <-g.slotFree:
		g.post(slot, b, slotUse{}, nil)
	default:
		g.mu.Lock()
		g.pending = append(g.pending, b)
		g.mu.Unlock()
	}
}

func (g *Group) post(slot int, b []byte, u slotUse, wrs []verbs.SendWR) error {
	if len(b) > slotSize {
		g.slotFree <- slot
		return fmt.Errorf("kernellink: a %d-byte message exceeds the %d-byte send slot", len(b), slotSize)
	}
	g.mu.Lock()
	g.use[slot] = u
	g.mu.Unlock()
	copy(g.tx.Bytes()[slot*slotSize:], b)
	g.slotSGE[slot] = verbs.SGEOf(g.tx, slot*slotSize, len(b))
	wrs = append(wrs, verbs.SendWR{ID: uint64(slot), Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: g.slotSGE[slot : slot+1 : slot+1]})
	if _, err := g.qp.PostSend(wrs); err != nil {
		g.mu.Lock()
		g.use[slot] = slotUse{}
		g.mu.Unlock()
		g.slotFree <- slot
		return fmt.Errorf("kernellink: posting to the kernel's QP: %w", err)
	}
	return nil
}

// failure is why the group ended (ErrAborted when it was not said).
func (g *Group) failure() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		return ErrAborted
	}
	return g.err
}
