package smc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The CLC (connection layer control) messages of RFC 7609 travel on the
// TCP connection before either side chooses SMC or TCP. Each starts with a
// header (eyecatcher "SMCR" in EBCDIC, type, length, version) and ends
// with the eyecatcher again as a trailer, all big-endian as on the wire.
const (
	clcProposal byte = 0x01
	clcAccept   byte = 0x02
	clcConfirm  byte = 0x03
	clcDecline  byte = 0x04

	clcVersion = 0x10 // version 1 in the high nibble of the version byte
	clcHdrLen  = 8    // eyecatcher(4) type(1) length(2) version(1)
	clcTrlLen  = 4
	maxName    = 64 // an RMB's export name
	// clcMaxLen bounds a CLC message: a peer announcing more is not
	// speaking CLC.
	clcMaxLen = clcHdrLen + 8 + 8 + 4 + 4 + 4 + 4 + 8 + 1 + maxName + clcTrlLen
	// clcNameAt is where a proposal's, accept's or confirm's name length
	// byte lies, the name following it.
	clcNameAt = 48
	// declineLen is RFC 7609's fixed decline length: header, peer ID,
	// diagnosis, reserved, trailer.
	declineLen = clcHdrLen + 8 + 4 + 4 + clcTrlLen
)

// eyecatcher is "SMCR" in EBCDIC.
var eyecatcher = [4]byte{0xe2, 0xd4, 0xc3, 0xd9}

// Reason says why a connection runs over TCP: a CLC decline's peer
// diagnosis code, from RFC 7609 and Linux's net/smc (smc_clc.h).
type Reason uint32

// The decline and fallback reasons this package records and sends.
const (
	// ReasonNone: the connection runs over SMC.
	ReasonNone Reason = 0
	// ReasonMem: no memory for a receive buffer (SMC_CLC_DECL_MEM).
	ReasonMem Reason = 0x01010000
	// ReasonTimeout: the handshake did not finish in time
	// (SMC_CLC_DECL_TIMEOUT_CL).
	ReasonTimeout Reason = 0x02010000
	// ReasonConfig: the peers' configurations do not match, such as
	// buffer geometry (SMC_CLC_DECL_CNFERR).
	ReasonConfig Reason = 0x03000000
	// ReasonPeerNoSMC: the peer did not indicate SMC: a plain TCP client,
	// or a server that spoke before a proposal arrived
	// (SMC_CLC_DECL_PEERNOSMC).
	ReasonPeerNoSMC Reason = 0x03010000
	// ReasonNoRuntime: this side has no krcore runtime (Options.Node is
	// nil), the SMC device of RFC 7609 (SMC_CLC_DECL_NOSMCDEV).
	ReasonNoRuntime Reason = 0x03030000
	// ReasonVersion: the peer speaks another CLC version
	// (SMC_CLC_DECL_VERSMISMAT).
	ReasonVersion Reason = 0x030c0000
	// ReasonSync: a malformed or unexpected CLC message
	// (SMC_CLC_DECL_SYNCERR).
	ReasonSync Reason = 0x04000000
	// ReasonPeerDeclined: the peer declined; Mode.Peer holds its reason
	// (SMC_CLC_DECL_PEERDECL).
	ReasonPeerDeclined Reason = 0x05000000
	// ReasonInternal: an unexpected local failure (SMC_CLC_DECL_INTERR).
	ReasonInternal Reason = 0x09990000
	// ReasonLink: the peer's node or buffer could not be reached over
	// krcore (SMC_CLC_DECL_ERR_RDYLNK).
	ReasonLink Reason = 0x09990002
	// ReasonRegRMB: a receive buffer could not be registered or exported
	// (SMC_CLC_DECL_ERR_REGRMB).
	ReasonRegRMB Reason = 0x09990003
)

var reasonText = map[Reason]string{
	ReasonNone: "none", ReasonMem: "no memory for a buffer", ReasonTimeout: "handshake timeout",
	ReasonConfig: "configuration mismatch", ReasonPeerNoSMC: "peer did not indicate SMC",
	ReasonNoRuntime: "no krcore runtime", ReasonVersion: "CLC version mismatch",
	ReasonSync: "CLC protocol error", ReasonPeerDeclined: "peer declined",
	ReasonInternal: "internal error", ReasonLink: "peer unreachable over krcore",
	ReasonRegRMB: "buffer registration failed",
}

// String names the reason and its code.
func (r Reason) String() string {
	if s, ok := reasonText[r]; ok {
		return fmt.Sprintf("%s (%#08x)", s, uint32(r))
	}
	return fmt.Sprintf("reason %#08x", uint32(r))
}

// errNotCLC: the bytes on the TCP connection are not a CLC message; they
// are the application's and stay in the stream.
var errNotCLC = errors.New("smc: not a CLC message")

// clcMsg is a CLC message's content. Proposal, accept and confirm carry
// the sender's SMC endpoint: its node and port (the QP of RFC 7609), the
// token that names the connection there (the RMBE alert token), and its
// receive buffer (the RMB's export name, the element's offset and
// length, which RFC 7609 carries as rkey, address and compressed size).
// A decline carries the reason. key (not in RFC 7609, whose CLC has no
// room for it: it follows the buffer's size, before the name) is the
// sender's connection's secret, which the peer's CDC and move messages to
// it carry beside the token (cdcMsg).
type clcMsg struct {
	typ    byte
	peerID uint64 // the sender's instance, RFC 7609's Peer ID
	node   uint64
	port   uint32
	token  uint32
	key    uint64
	off    uint32
	size   uint32
	name   string
	reason Reason
}

// encode lays m out in its CLC shape.
func (m *clcMsg) encode() []byte {
	be := binary.BigEndian
	var b []byte
	if m.typ == clcDecline {
		b = make([]byte, declineLen)
		be.PutUint64(b[8:], m.peerID)
		be.PutUint32(b[16:], uint32(m.reason))
	} else {
		b = make([]byte, clcNameAt+1+len(m.name)+clcTrlLen)
		be.PutUint64(b[8:], m.peerID)
		be.PutUint64(b[16:], m.node)
		be.PutUint32(b[24:], m.port)
		be.PutUint32(b[28:], m.token)
		be.PutUint32(b[32:], m.off)
		be.PutUint32(b[36:], m.size)
		be.PutUint64(b[40:], m.key)
		b[clcNameAt] = byte(len(m.name))
		copy(b[clcNameAt+1:], m.name)
	}
	copy(b, eyecatcher[:])
	b[4] = m.typ
	be.PutUint16(b[5:], uint16(len(b)))
	b[7] = clcVersion
	copy(b[len(b)-clcTrlLen:], eyecatcher[:])
	return b
}

// clcPrefix reports whether b could begin a CLC message of one of types:
// false as soon as a byte differs, so that an application's first bytes
// are handed over without waiting for more.
func clcPrefix(b []byte, types ...byte) bool {
	n := min(len(b), 4)
	if [4]byte(append(b[:n:n], eyecatcher[n:]...)) != eyecatcher {
		return false
	}
	if len(b) < 5 {
		return true
	}
	for _, t := range types {
		if b[4] == t {
			return true
		}
	}
	return false
}

// readCLC reads one CLC message of one of types from r. Bytes that are
// not one come back with errNotCLC, to be given to the application; the
// bytes of a CLC message are consumed. An I/O error comes back with what
// was read.
func readCLC(r io.Reader, types ...byte) (*clcMsg, []byte, error) {
	buf := make([]byte, 0, clcMaxLen)
	want := clcHdrLen
	for len(buf) < want {
		k, err := r.Read(buf[len(buf):want])
		buf = buf[:len(buf)+k]
		if !clcPrefix(buf, types...) {
			return nil, buf, errNotCLC
		}
		if len(buf) >= clcHdrLen && want == clcHdrLen {
			l := int(binary.BigEndian.Uint16(buf[5:]))
			if l < clcHdrLen+clcTrlLen+8 || l > clcMaxLen {
				return nil, buf, errNotCLC
			}
			want = l
		}
		if err != nil && len(buf) < want {
			return nil, buf, err
		}
	}
	m, err := decodeCLC(buf)
	return m, buf, err
}

// decodeCLC parses a whole message whose header readCLC checked.
func decodeCLC(b []byte) (*clcMsg, error) {
	if [4]byte(b[len(b)-clcTrlLen:]) != eyecatcher {
		return nil, errNotCLC
	}
	be := binary.BigEndian
	m := &clcMsg{typ: b[4], peerID: be.Uint64(b[8:])}
	if b[7]&0xf0 != clcVersion {
		return m, fmt.Errorf("smc: CLC version %#x: %w", b[7]>>4, errVersion)
	}
	if m.typ == clcDecline {
		if len(b) != declineLen {
			return nil, errNotCLC
		}
		m.reason = Reason(be.Uint32(b[16:]))
		return m, nil
	}
	const at = clcNameAt
	if len(b) < at+1+clcTrlLen || len(b) != at+1+int(b[at])+clcTrlLen {
		return nil, errNotCLC
	}
	m.node, m.port, m.token = be.Uint64(b[16:]), be.Uint32(b[24:]), be.Uint32(b[28:])
	m.off, m.size, m.key = be.Uint32(b[32:]), be.Uint32(b[36:]), be.Uint64(b[40:])
	m.name = string(b[at+1 : at+1+int(b[at])])
	return m, nil
}

// errVersion: a well-formed CLC message of another version.
var errVersion = errors.New("smc: CLC version mismatch")
