// Package kernellink is the Go end of an SMC-Rv2 link group toward a
// Linux kernel AF_SMC peer, on any verbs device (the ibverbs provider on
// rxe or a RoCE NIC), as server or client:
//
//   - Accept answers the kernel client's CLC proposal with an accept
//     offering a new link group (first contact: an RC QP and a receive
//     buffer), reads its confirm, connects the QPs and confirms the link
//     with LLCv2 CONFIRM_LINK; Echo then serves the connection as an echo
//     server (RDMA WRITEs into the peer's buffer and CDC messages, as the
//     kernel's own data path).
//   - Dial sends the proposal to a kernel server, reads its accept,
//     confirms with our QP and buffer and answers its CONFIRM_LINK;
//     RoundTrip then writes bytes and reads their echo.
//
// One link (max_links 1: the kernel then asks for no second one), one
// connection; Shutdown and Echo's end exchange the close CDCs, and Close
// ends the link group with DELETE_LINK.
//
// Not built yet: a net.Conn (concurrent reads and writes), more
// connections on a link group, ADD_LINK, abnormal closes.
package kernellink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// Config is what the server offers in its accept.
type Config struct {
	// Device is the RDMA device whose port carries the TCP connection's
	// local address (its GID is the IPv4-mapped one of that address).
	Device verbs.Device
	// MAC is the hardware address of the network device under Device.
	MAC net.HardwareAddr
	// SystemID names this host to the peer (the kernel's is random).
	SystemID [8]byte
	// Hostname goes into the first-contact extension.
	Hostname string
}

// The buffers: one receive buffer (RMB) of rmbSize for the connection,
// and LLC receive buffers of the size the kernel's v2 messages may take.
const (
	rmbSize     = 64 << 10
	rmbSizeComp = 2 // 16 KiB << 2
	llcBufSize  = 8 << 10
	llcRecvs    = 8
	mtuEnum     = 3 // IB MTU 1024: rxe's default path MTU
	mtuBytes    = 1024
	linkNum     = 1
	alertToken  = 1
)

// Link is one established link toward the kernel, with its connection's
// buffers.
type Link struct {
	// Peer is the kernel's CLC confirm (we serve) or accept (we dial):
	// its QP, buffer and token.
	Peer *smcr.AcceptConfirm
	// PeerLink is the kernel's CONFIRM_LINK, response or request.
	PeerLink *smcr.ConfirmLink

	pd       verbs.PD
	cq       verbs.CQ
	qp       verbs.QP
	mem      []*offheap.Block
	mrs      []verbs.MR
	rmb, llc verbs.MR
	tx, out  verbs.MR   // small SENDs; a client's outgoing bytes
	recvd    []verbs.WC // receive completions polled while awaiting a send's
	s        stream     // the connection's cursors
}

// Accept runs the server's side of a first-contact SMC-Rv2 handshake on
// c, whose proposal p was read already: accept, confirm, QP up, CONFIRM_LINK
// both ways. On an error the link is torn down and the TCP connection
// is left to the caller (the kernel falls back or fails the connect).
func Accept(ctx context.Context, c net.Conn, p *smcr.Proposal, cfg Config) (*Link, error) {
	if p.V2 == nil || p.TypeV2 != smcr.SMCTypeR && p.TypeV2 != smcr.SMCTypeB || len(p.V2.EIDs) == 0 {
		return nil, errors.New("kernellink: the proposal offers no SMC-Rv2 with a user EID")
	}
	return open(ctx, c, cfg, func(l *Link) error {
		if err := writeCLC(c, l.accept(p, cfg), "accept"); err != nil {
			return err
		}
		var err error
		if l.Peer, err = readCLC(c, smcr.TypeConfirm); err != nil {
			return err
		}
		return l.connect(ctx)
	})
}

// open makes a link on cfg.Device and runs handshake over c on it, under
// ctx's deadline; a link whose handshake fails is closed.
func open(ctx context.Context, c net.Conn, cfg Config, handshake func(l *Link) error) (*Link, error) {
	l := &Link{}
	if err := l.setup(cfg.Device); err != nil {
		l.Close()
		return nil, err
	}
	if dl, has := ctx.Deadline(); has {
		c.SetDeadline(dl)
		defer c.SetDeadline(time.Time{})
	}
	if err := handshake(l); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// writeCLC sends one CLC message (what names it in an error) on c.
func writeCLC(c net.Conn, m interface{ Append([]byte) ([]byte, error) }, what string) error {
	b, err := m.Append(nil)
	if err != nil {
		return err
	}
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("kernellink: sending the %s: %w", what, err)
	}
	return nil
}

func (l *Link) setup(dev verbs.Device) error {
	var err error
	if l.pd, err = dev.AllocPD(); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	if l.cq, err = dev.CreateCQ(64); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	l.qp, err = l.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: l.cq, RecvCQ: l.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 2 * llcRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	if l.rmb, err = l.region(rmbSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	if l.llc, err = l.region(llcRecvs*llcBufSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if l.out, err = l.region(rmbSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	l.tx, err = l.region(4096, verbs.AccessLocalWrite)
	return err
}

func (l *Link) region(n int, a verbs.Access) (verbs.MR, error) {
	b, err := offheap.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("kernellink: %w", err)
	}
	l.mem = append(l.mem, b)
	mr, err := l.pd.RegMR(b.Bytes(), a)
	if err != nil {
		return nil, fmt.Errorf("kernellink: registering %d bytes: %w", n, err)
	}
	l.mrs = append(l.mrs, mr)
	return mr, nil
}

// accept is the accept the kernel's server would send: our QP, the RMB,
// the negotiated EID, and release 1's limits (one link).
func (l *Link) accept(p *smcr.Proposal, cfg Config) *smcr.AcceptConfirm {
	ep := l.qp.Endpoint()
	host := [32]byte(smcr.MakeEID(cfg.Hostname))
	a := &smcr.AcceptConfirm{
		Type: smcr.TypeAccept, Version: 2, FirstContact: true,
		PeerID: cfg.SystemID, GID: [16]byte(ep.GID), QPN: ep.QPN,
		RMBRkey: l.rmb.RKey(), RMBEIdx: 1, AlertToken: alertToken,
		RMBESize: rmbSizeComp, QPMTU: mtuEnum, RMBAddr: l.rmb.Addr(), PSN: ep.PSN & 0xffffff,
		EID: p.V2.EIDs[0],
		FCE: &smcr.FirstContactExt{V2Direct: true, OSType: smcr.OSLinux, Release: 1, Hostname: host,
			MaxConns: 255, MaxLinks: 1},
	}
	copy(a.MAC[:], cfg.MAC)
	return a
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
		return nil, fmt.Errorf("kernellink: the kernel declined: %s", smcr.DeclineName(d.Diagnosis))
	}
	m, err := smcr.DecodeAcceptConfirm(b)
	if err != nil {
		return nil, err
	}
	if m.Type != want || m.Version < 2 || !m.FirstContact || m.FCE == nil {
		return nil, fmt.Errorf("kernellink: CLC type %d version %d first contact %v where a first-contact v2 type %d belongs",
			m.Type, m.Version, m.FirstContact, want)
	}
	return m, nil
}

// up connects the QP to the kernel's (l.Peer) and posts the receives.
func (l *Link) up() error {
	cf := l.Peer
	remote := verbs.Endpoint{GID: verbs.GID(cf.GID), QPN: cf.QPN, PSN: cf.PSN}
	if err := verbs.Connect(l.qp, remote, verbs.Path{MTU: mtuBytes}); err != nil {
		return fmt.Errorf("kernellink: %w", err)
	}
	rwr := make([]verbs.RecvWR, llcRecvs)
	for i := range rwr {
		rwr[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{verbs.SGEOf(l.llc, i*llcBufSize, llcBufSize)}}
	}
	if _, err := l.qp.PostRecv(rwr); err != nil {
		return fmt.Errorf("kernellink: posting LLC receives: %w", err)
	}
	return nil
}

// connect brings the QP up toward the kernel's and runs CONFIRM_LINK as
// the server: our request first, the kernel answers.
func (l *Link) connect(ctx context.Context) error {
	if err := l.up(); err != nil {
		return err
	}
	ep := l.qp.Endpoint()
	req := &smcr.ConfirmLink{Version: 2, Flags: smcr.LLCFlagNoRMBEEyeC, SenderGID: [16]byte(ep.GID),
		SenderQPN: ep.QPN, LinkNum: linkNum, LinkUID: [4]byte{'k', 'r', 'c', 1}, MaxLinks: 1, MaxConns: 255}
	if err := l.send(ctx, req.Append(nil)); err != nil {
		return err
	}
	msg, err := l.recvLLC(ctx)
	if err != nil {
		return err
	}
	resp, ok := msg.(*smcr.ConfirmLink)
	if !ok || resp.Flags&smcr.LLCFlagResp == 0 {
		return fmt.Errorf("kernellink: %T (%+v) where the CONFIRM_LINK response belongs", msg, msg)
	}
	l.PeerLink = resp
	return nil
}

// send SENDs b (at most the tx buffer) and waits for its completion.
func (l *Link) send(ctx context.Context, b []byte) error {
	copy(l.tx.Bytes(), b)
	wr := []verbs.SendWR{{ID: 1 << 32, Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{verbs.SGEOf(l.tx, 0, len(b))}}}
	if _, err := l.qp.PostSend(wr); err != nil {
		return fmt.Errorf("kernellink: posting a SEND: %w", err)
	}
	wc, err := l.wait(ctx, verbs.WCSend)
	if err != nil {
		return err
	}
	if wc.Status != verbs.Success {
		return fmt.Errorf("kernellink: SEND completed with %v", wc.Status)
	}
	return nil
}

// recvLLC waits for the next message and decodes it as LLC.
func (l *Link) recvLLC(ctx context.Context) (smcr.LLCMessage, error) {
	b, err := l.recv(ctx)
	if err != nil {
		return nil, err
	}
	return smcr.DecodeLLC(b)
}

// recv waits for the next message the peer SENT (LLC or CDC), copies it
// out and reposts its buffer.
func (l *Link) recv(ctx context.Context) ([]byte, error) {
	wc, err := l.wait(ctx, verbs.WCRecv)
	if err != nil {
		return nil, err
	}
	if wc.Status != verbs.Success {
		return nil, fmt.Errorf("kernellink: receive completed with %v", wc.Status)
	}
	i := int(wc.ID)
	b := append([]byte(nil), l.llc.Bytes()[i*llcBufSize:i*llcBufSize+int(wc.ByteLen)]...)
	rwr := []verbs.RecvWR{{ID: wc.ID, SGL: []verbs.SGE{verbs.SGEOf(l.llc, i*llcBufSize, llcBufSize)}}}
	if _, err := l.qp.PostRecv(rwr); err != nil {
		return nil, fmt.Errorf("kernellink: reposting a receive: %w", err)
	}
	return b, nil
}

// wait polls the CQ until a completion of kind op arrives, sleeping on
// the CQ between polls. Receives that arrive while a send is awaited are
// kept for the next wait for a receive; a failed completion of either
// kind ends the wait.
func (l *Link) wait(ctx context.Context, op verbs.WCOpcode) (verbs.WC, error) {
	if op == verbs.WCRecv && len(l.recvd) > 0 {
		wc := l.recvd[0]
		l.recvd = l.recvd[1:]
		return wc, nil
	}
	wc := make([]verbs.WC, 1)
	for {
		n, err := l.cq.Poll(wc)
		if err != nil {
			return verbs.WC{}, fmt.Errorf("kernellink: polling: %w", err)
		}
		if n == 1 && (wc[0].Op == op || wc[0].Status != verbs.Success) {
			return wc[0], nil
		}
		if n == 1 {
			if wc[0].Op == verbs.WCRecv {
				l.recvd = append(l.recvd, wc[0])
			}
			continue
		}
		if err := l.cq.Wait(ctx); err != nil {
			return verbs.WC{}, fmt.Errorf("kernellink: waiting for a %v completion: %w", op, err)
		}
	}
}

// Close tells the kernel the link group is gone (LLC DELETE_LINK, all
// links, orderly: it then terminates its link group at once instead of
// finding the QP dead on its next use), then destroys the QP and frees
// the buffers. The DELETE_LINK waits at most a second for its ACK.
func (l *Link) Close() error {
	var errs []error
	if l.PeerLink != nil && l.qp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		del := &smcr.DeleteLink{Version: 2, Flags: smcr.LLCFlagDelLinkAll | smcr.LLCFlagDelLinkOrdly,
			LinkNum: linkNum, Reason: smcr.DelLinkOpInit}
		errs = append(errs, l.send(ctx, del.Append(nil)))
		cancel()
	}
	if l.qp != nil {
		errs = append(errs, l.qp.Close())
	}
	for _, mr := range l.mrs {
		errs = append(errs, mr.Close())
	}
	if l.cq != nil {
		errs = append(errs, l.cq.Close())
	}
	if l.pd != nil {
		errs = append(errs, l.pd.Close())
	}
	for _, b := range l.mem {
		errs = append(errs, b.Close())
	}
	*l = Link{Peer: l.Peer, PeerLink: l.PeerLink}
	return errors.Join(errs...)
}
