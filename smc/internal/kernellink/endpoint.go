package kernellink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/smc/internal/smcr"
)

// Endpoint is this side's link groups toward kernel peers on one device.
type Endpoint struct {
	cfg Config

	// first lets one first contact run at a time as the server (the
	// kernel's smc_server_lgr_pending): proposals from one peer arriving
	// together then share the group the first makes.
	first chan struct{}

	mu     sync.Mutex
	groups map[*Group]bool
	busy   int // handshakes running: an idle group stays up for them
	closed bool

	addLinksDeclined atomic.Int64
}

// AddLinksDeclined is how many ADD_LINK requests the kernel sent and
// this side declined.
func (e *Endpoint) AddLinksDeclined() int64 { return e.addLinksDeclined.Load() }

// NewEndpoint returns an endpoint with cfg; it owns the groups its
// Accepts and Dials make, until Close.
func NewEndpoint(cfg Config) *Endpoint {
	if cfg.MaxLinks == 0 {
		cfg.MaxLinks = 2
	}
	return &Endpoint{cfg: cfg, groups: map[*Group]bool{}, first: make(chan struct{}, 1)}
}

// Groups is how many link groups are up.
func (e *Endpoint) Groups() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.groups)
}

// Close ends every group (DELETE_LINK toward the kernel), aborting their
// connections.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	e.closed = true
	gs := e.groups
	e.groups = map[*Group]bool{}
	e.mu.Unlock()
	for g := range gs {
		g.close(ErrClosed)
	}
	return nil
}

// find returns the group up toward the peer that matches, as the kernel
// matches one (smcr_lgr_match): its system ID and GID, and as a client
// the server's QP.
func (e *Endpoint) find(server bool, peerID [8]byte, peerGID [16]byte, peerQPN uint32) *Group {
	e.mu.Lock()
	defer e.mu.Unlock()
	for g := range e.groups {
		if g.server == server && g.peerID == peerID && g.peerGID == peerGID && (server || g.peerQPN == peerQPN) {
			g.mu.Lock()
			ok := g.err == nil
			g.mu.Unlock()
			if ok {
				return g
			}
		}
	}
	return nil
}

// begin counts a handshake in; the returned func counts it out.
func (e *Endpoint) begin() func() {
	e.mu.Lock()
	e.busy++
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		e.busy--
		e.mu.Unlock()
	}
}

func (e *Endpoint) handshaking() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.busy > 0
}

// keep registers a confirmed group, unless the endpoint was closed.
func (e *Endpoint) keep(g *Group) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.groups[g] = true
	return nil
}

func (e *Endpoint) forget(g *Group) {
	e.mu.Lock()
	delete(e.groups, g)
	e.mu.Unlock()
}

// close ends g from this side: DELETE_LINK, then its connections abort
// with err and its resources go.
func (g *Group) close(err error) {
	if g.detach(err) {
		g.end(true)
	}
}

// detach marks g ended with err, aborts its connections and takes it off
// the endpoint; false if g had ended already.
func (g *Group) detach(err error) bool {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return false
	}
	g.err = err
	conns := g.conns
	g.conns = map[uint32]*Conn{}
	if g.idle != nil {
		g.idle.Stop()
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.abort(err)
	}
	g.ep.forget(g)
	return true
}

// idleCheck runs when a group's last connection left: after the linger,
// a group still without connections is closed.
func (g *Group) idleCheck() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.conns) > 0 || g.err != nil {
		return
	}
	if g.idle != nil {
		g.idle.Stop()
	}
	g.idle = time.AfterFunc(g.ep.cfg.Linger, func() { // owned by g: close stops it
		if g.ep.handshaking() {
			// A handshake may be about to reuse g (the kernel chose it
			// already): look again after another linger.
			g.idleCheck()
			return
		}
		g.mu.Lock()
		empty := len(g.conns) == 0
		g.mu.Unlock()
		if empty {
			g.close(ErrClosed)
		}
	})
}

// Accept serves a kernel client's connection c, whose CLC proposal p was
// read already: on the group toward that peer if one is up, else on a
// new one (first contact). On an error c is left to the caller; when the
// proposal cannot be served the kernel was sent a decline (it falls back
// to TCP on c).
func (e *Endpoint) Accept(ctx context.Context, c net.Conn, p *smcr.Proposal) (*Conn, error) {
	if code := e.check(p); code != 0 {
		d := &smcr.Decline{Version: 2, PeerID: e.cfg.SystemID, Diagnosis: code, OSType: smcr.OSLinux}
		writeCLC(c, d.Append(nil), "decline")
		return nil, &Declined{Code: code, Ours: true}
	}
	defer deadline(ctx, c)()
	defer e.begin()()
	select {
	case e.first <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("kernellink: waiting for another first contact: %w", ctx.Err())
	}
	release := func() { <-e.first }
	if g := e.find(true, p.PeerID, p.V2.RoCEGID, 0); g != nil {
		release()
		conn, err := g.newConn()
		if err != nil {
			return nil, err
		}
		if err := conn.serverHandshake(ctx, c, p, false); err != nil {
			conn.drop()
			return nil, err
		}
		return conn, nil
	}
	defer release()
	g, err := newGroup(e, true)
	if err != nil {
		return nil, err
	}
	// Keyed as the kernel's server keys its groups: by what the proposal
	// names (a v2-only one leaves the system ID zero).
	g.peerID, g.peerGID = p.PeerID, p.V2.RoCEGID
	conn, err := g.newConn()
	if err == nil {
		err = conn.serverHandshake(ctx, c, p, true)
	}
	if err == nil {
		err = g.confirmServer(ctx)
	}
	if err == nil {
		err = e.keep(g)
	}
	if err != nil {
		g.close(err)
		return nil, err
	}
	return conn, nil
}

// check is the decline code for a proposal this side cannot serve, or 0.
func (e *Endpoint) check(p *smcr.Proposal) uint32 {
	switch {
	case p.V2 == nil || p.TypeV2 != smcr.SMCTypeR && p.TypeV2 != smcr.SMCTypeB:
		return smcr.DeclineNoV2Ext
	case len(p.V2.EIDs) == 0:
		return smcr.DeclineNoUEID
	}
	for _, eid := range p.V2.EIDs {
		if eid == e.cfg.EID {
			return 0
		}
	}
	return smcr.DeclineNoUEID
}

// deadline puts ctx's deadline on c until the returned func runs.
func deadline(ctx context.Context, c net.Conn) func() {
	dl, has := ctx.Deadline()
	if !has {
		return func() {}
	}
	c.SetDeadline(dl)
	return func() { c.SetDeadline(time.Time{}) }
}

// Dial runs the client's side of the handshake on c, a TCP connection
// to a kernel AF_SMC server whose SYN-ACK carried the SMC option (the
// SYN must carry it too: smcopt's Announcer): our proposal (SMC-Rv2
// only, the user EID), then the kernel's choice: a connection on a
// group already up toward it, or a new one (first contact: our confirm
// with our QP, its CONFIRM_LINK answered).
func (e *Endpoint) Dial(ctx context.Context, c net.Conn) (*Conn, error) {
	defer deadline(ctx, c)()
	defer e.begin()()
	// A fresh group's QP goes into the proposal (the kernel reads its GID
	// there); if the kernel reuses a group, the fresh one goes.
	g, err := newGroup(e, false)
	if err != nil {
		return nil, err
	}
	ep := g.local()
	p := &smcr.Proposal{Version: 2, TypeV1: smcr.SMCTypeN, TypeV2: smcr.SMCTypeR, PeerID: e.cfg.SystemID,
		V2: &smcr.V2Extension{Release: 1, RoCEGID: [16]byte(ep.GID), MaxConns: 255,
			MaxLinks: e.cfg.MaxLinks, EIDs: []smcr.EID{e.cfg.EID}}}
	b, err := p.Append(nil)
	if err == nil {
		err = writeCLC(c, b, "proposal")
	}
	var a *smcr.AcceptConfirm
	if err == nil {
		a, err = readCLC(c, smcr.TypeAccept)
	}
	if err != nil {
		g.close(err)
		return nil, err
	}
	if !a.FirstContact {
		g.close(ErrClosed)
		return e.dialReused(ctx, c, a)
	}
	g.peerID, g.peerGID, g.peerQPN = a.PeerID, a.GID, a.QPN
	// Kept before the link is confirmed: the kernel may accept the next
	// connection on it as soon as our CONFIRM_LINK response arrived.
	err = e.keep(g)
	var conn *Conn
	if err == nil {
		conn, err = g.newConn()
	}
	if err == nil {
		err = conn.clientHandshake(ctx, c, a)
	}
	if err == nil {
		err = g.confirmClient(ctx)
	}
	if err != nil {
		g.close(err)
		return nil, err
	}
	return conn, nil
}

// dialReused confirms a connection on the group the kernel's accept a
// named (no first contact), or declines when none matches.
func (e *Endpoint) dialReused(ctx context.Context, c net.Conn, a *smcr.AcceptConfirm) (*Conn, error) {
	g := e.find(false, a.PeerID, a.GID, a.QPN)
	if g == nil {
		d := &smcr.Decline{Version: 2, OutOfSync: true, PeerID: e.cfg.SystemID, Diagnosis: smcr.DeclineSyncErr, OSType: smcr.OSLinux}
		writeCLC(c, d.Append(nil), "decline")
		return nil, &Declined{Code: smcr.DeclineSyncErr, Ours: true}
	}
	conn, err := g.newConn()
	if err != nil {
		return nil, err
	}
	if err := conn.clientHandshake(ctx, c, a); err != nil {
		conn.drop()
		return nil, err
	}
	return conn, nil
}

// writeCLC sends one encoded CLC message (what names it in an error).
func writeCLC(c net.Conn, b []byte, what string) error {
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("kernellink: sending the %s: %w", what, err)
	}
	return nil
}

// readCLC reads the kernel's accept or confirm (want), or its decline.
func readCLC(c net.Conn, want byte) (*smcr.AcceptConfirm, error) {
	b, err := smcr.ReadCLC(c)
	if err != nil {
		return nil, fmt.Errorf("kernellink: waiting for CLC type %d: %w", want, err)
	}
	if h, _ := smcr.ParseHeader(b); h.Type == smcr.TypeDecline {
		d, err := smcr.DecodeDecline(b)
		if err != nil {
			return nil, err
		}
		return nil, &Declined{Code: d.Diagnosis}
	}
	m, err := smcr.DecodeAcceptConfirm(b)
	if err != nil {
		return nil, err
	}
	if m.Type != want || m.Version < 2 || m.FirstContact && m.FCE == nil {
		return nil, fmt.Errorf("kernellink: CLC type %d version %d where a v2 type %d belongs: %w",
			m.Type, m.Version, want, errors.ErrUnsupported)
	}
	return m, nil
}

// Declined is a CLC decline, this side's (Ours) or the kernel's: the
// connection falls back to TCP. It matches ErrDeclined.
type Declined struct {
	Code uint32 // the diagnosis, one of smcr's Decline codes
	Ours bool
}

// Error says which side declined and why (the decline code's name and value).
func (d *Declined) Error() string {
	who := "the kernel"
	if d.Ours {
		who = "this side"
	}
	return fmt.Sprintf("kernellink: %s declined: %s (%#08x)", who, smcr.DeclineName(d.Code), d.Code)
}

// Is makes a Declined match ErrDeclined.
func (d *Declined) Is(target error) bool { return target == ErrDeclined }
