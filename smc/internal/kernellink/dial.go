package kernellink

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/krcore/krcore/smc/internal/smcr"
)

// Dial runs the client's side of a first-contact SMC-Rv2 handshake on c,
// a TCP connection to a kernel AF_SMC server whose SYN-ACK carried the
// SMC option (the SYN must carry it too: smcopt.AnnounceDial): our
// proposal (SMC-Rv2 only, the user EID eid, max_links 1), the kernel's
// accept, our confirm with our QP and buffer, then the kernel's
// CONFIRM_LINK answered.
func Dial(ctx context.Context, c net.Conn, eid smcr.EID, cfg Config) (*Link, error) {
	return open(ctx, c, cfg, func(l *Link) error {
		ep := l.qp.Endpoint()
		// The kernel's own v2-only proposal leaves the system ID zero, and a
		// kernel server then reuses any link group it has with a zero-ID peer
		// at our GID (another kernel client's): ours makes it a new one.
		p := &smcr.Proposal{Version: 2, TypeV1: smcr.SMCTypeN, TypeV2: smcr.SMCTypeR, PeerID: cfg.SystemID,
			V2: &smcr.V2Extension{Release: 1, RoCEGID: [16]byte(ep.GID), MaxConns: 255, MaxLinks: 1, EIDs: []smcr.EID{eid}}}
		if err := writeCLC(c, p, "proposal"); err != nil {
			return err
		}
		var err error
		if l.Peer, err = readCLC(c, smcr.TypeAccept); err != nil {
			return err
		}
		if err := l.up(); err != nil {
			return err
		}
		if err := writeCLC(c, l.confirm(cfg), "confirm"); err != nil {
			return err
		}
		return l.answerConfirmLink(ctx, cfg)
	})
}

// confirm is the client's confirm for the kernel's accept (l.Peer): our
// QP, RMB and GID, and the first-contact limits the accept set, echoed
// (the kernel checks that they match).
func (l *Link) confirm(cfg Config) *smcr.AcceptConfirm {
	ep := l.qp.Endpoint()
	a := l.Peer
	f := *a.FCE
	f.OSType, f.Hostname = smcr.OSLinux, [32]byte(smcr.MakeEID(cfg.Hostname))
	m := &smcr.AcceptConfirm{
		Type: smcr.TypeConfirm, Version: 2, FirstContact: true,
		PeerID: cfg.SystemID, GID: [16]byte(ep.GID), QPN: ep.QPN,
		RMBRkey: l.rmb.RKey(), RMBEIdx: 1, AlertToken: alertToken,
		RMBESize: rmbSizeComp, QPMTU: min(a.QPMTU, mtuEnum), RMBAddr: l.rmb.Addr(), PSN: ep.PSN & 0xffffff,
		EID: a.EID, FCE: &f, GIDs: [][16]byte{[16]byte(ep.GID)},
	}
	copy(m.MAC[:], cfg.MAC)
	return m
}

// answerConfirmLink waits for the server's CONFIRM_LINK request and
// answers it.
func (l *Link) answerConfirmLink(ctx context.Context, cfg Config) error {
	msg, err := l.recvLLC(ctx)
	if err != nil {
		return err
	}
	req, ok := msg.(*smcr.ConfirmLink)
	if !ok || req.Flags&smcr.LLCFlagResp != 0 {
		return fmt.Errorf("kernellink: %T (%+v) where the server's CONFIRM_LINK belongs", msg, msg)
	}
	ep := l.qp.Endpoint()
	resp := &smcr.ConfirmLink{Version: 2, Flags: smcr.LLCFlagResp | req.Flags, SenderGID: [16]byte(ep.GID),
		SenderQPN: ep.QPN, LinkNum: req.LinkNum, LinkUID: [4]byte{'k', 'r', 'c', 2},
		MaxLinks: req.MaxLinks, MaxConns: req.MaxConns}
	copy(resp.SenderMAC[:], cfg.MAC)
	if err := l.send(ctx, resp.Append(nil)); err != nil {
		return err
	}
	l.PeerLink = req
	return nil
}

// RoundTrip writes p (at most the peer's buffer) into the peer's RMB,
// then waits until as many bytes came back into ours and returns them:
// one exchange with an echo server, as the client's data path (RDMA
// WRITE, CDC; the peer's CDC, our consumer cursor in the next one).
func (l *Link) RoundTrip(ctx context.Context, p []byte) ([]byte, error) {
	s := &l.s
	if len(p) > l.peerSize() || len(p) > rmbSize {
		return nil, fmt.Errorf("kernellink: %d bytes in one round trip, at most %d", len(p), min(l.peerSize(), rmbSize))
	}
	for uint64(l.peerSize())-(s.txProd-s.txPeerCons) < uint64(len(p)) {
		if err := l.next(ctx, s); err != nil {
			return nil, err
		}
	}
	if err := l.writeOut(ctx, p); err != nil {
		return nil, err
	}
	for s.rxProd-s.rxCons < uint64(len(p)) {
		if s.peerClosed {
			return nil, ErrPeerClosed
		}
		if err := l.next(ctx, s); err != nil {
			return nil, err
		}
	}
	out := make([]byte, len(p))
	for done := 0; done < len(p); {
		off := int((s.rxCons + uint64(done)) % rmbSize)
		done += copy(out[done:], l.rmb.Bytes()[off:min(rmbSize, off+len(p)-done)])
	}
	s.rxCons += uint64(len(p))
	return out, nil
}

// writeOut copies p into the staging buffer (our RMB holds the peer's
// bytes) and writes it to the peer.
func (l *Link) writeOut(ctx context.Context, p []byte) error {
	if len(p) > len(l.out.Bytes()) {
		return errors.New("kernellink: round trip larger than the staging buffer")
	}
	copy(l.out.Bytes(), p)
	return l.write(ctx, &l.s, l.out, 0, uint64(len(p)))
}

// Shutdown sends our close CDC (after every byte written): the kernel
// peer's reads then end.
func (l *Link) Shutdown(ctx context.Context) error {
	return l.sendCDC(ctx, &l.s, 0, smcr.CDCPeerConnClosed)
}
