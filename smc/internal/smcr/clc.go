package smcr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ErrMalformed is wrapped by every decoding error: the bytes are not the
// message they were taken for.
var ErrMalformed = errors.New("smcr: malformed message")

// ErrUnsupported is wrapped when a message is well formed but of a kind
// this package does not decode (SMC-D's accept and confirm).
var ErrUnsupported = errors.New("smcr: unsupported message")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// CLC message types (the header's type byte).
const (
	TypeProposal byte = 0x01
	TypeAccept   byte = 0x02
	TypeConfirm  byte = 0x03
	TypeDecline  byte = 0x04
)

// SMCType is a CLC header's two-bit SMC type: which SMC variants a
// proposal offers, or which one an accept or confirm chose.
type SMCType uint8

// The SMC types.
const (
	SMCTypeR SMCType = 0 // SMC-R
	SMCTypeD SMCType = 1 // SMC-D
	SMCTypeN SMCType = 2 // none
	SMCTypeB SMCType = 3 // both
)

// indicatesR and indicatesD say whether t offers SMC-R and SMC-D.
func (t SMCType) indicatesR() bool { return t == SMCTypeR || t == SMCTypeB }
func (t SMCType) indicatesD() bool { return t == SMCTypeD || t == SMCTypeB }

// The eyecatchers that open and close every CLC message: "SMCR" and
// "SMCD" in EBCDIC.
var (
	EyecatcherR = [4]byte{0xe2, 0xd4, 0xc3, 0xd9}
	EyecatcherD = [4]byte{0xe2, 0xd4, 0xc3, 0xc4}
)

// Sizes of the CLC messages' parts.
const (
	HeaderLen      = 8
	trailerLen     = 4
	proposalBase   = 40 // header, local ID/GID/MAC, iparea_offset
	smcdAreaLen    = 40 // SMC-D GID, CHID, v2_ext_offset, reserved
	prefixLen      = 8  // IPv4 subnet, prefix length, IPv6 prefix count
	ipv6PrefixLen  = 17
	v2ExtFixedLen  = 40
	smcdV2FixedLen = 48
	gidChidLen     = 10
	// MaxCLCLen bounds a CLC message: the largest proposal the kernel
	// builds (struct smc_clc_msg_proposal_area) is below it.
	MaxCLCLen = 1024

	maxV6Prefixes = 8 // SMC_CLC_MAX_V6_PREFIX
	maxUEIDs      = 8 // SMC_CLC_MAX_UEID
	maxISMGIDs    = 8 // SMCD_CLC_MAX_V2_GID_ENTRIES
)

// Header is a CLC message's 8-byte header.
type Header struct {
	Eyecatcher [4]byte
	Type       byte
	Length     uint16
	Version    uint8   // 1 or 2
	TypeV2     SMCType // in accept and confirm, bit 1 is the first-contact flag
	TypeV1     SMCType // in accept and confirm, the chosen SMC type
}

// ParseHeader decodes the CLC header at the start of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, malformed("CLC header needs %d bytes, have %d", HeaderLen, len(b))
	}
	h := Header{
		Type: b[4], Length: binary.BigEndian.Uint16(b[5:]),
		Version: b[7] >> 4, TypeV2: SMCType(b[7] >> 2 & 3), TypeV1: SMCType(b[7] & 3),
	}
	copy(h.Eyecatcher[:], b)
	if h.Eyecatcher != EyecatcherR && h.Eyecatcher != EyecatcherD {
		return h, malformed("CLC eyecatcher % x", h.Eyecatcher)
	}
	return h, nil
}

func (h Header) appendTo(b []byte) []byte {
	b = append(b, h.Eyecatcher[:]...)
	b = append(b, h.Type)
	b = binary.BigEndian.AppendUint16(b, h.Length)
	return append(b, h.Version<<4|byte(h.TypeV2&3)<<2|byte(h.TypeV1&3))
}

// ReadCLC reads one CLC message from r: the header, then the rest of the
// length it announces (at most MaxCLCLen). It does not check the body.
func ReadCLC(r io.Reader) ([]byte, error) {
	b := make([]byte, HeaderLen, 256)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("smcr: reading a CLC header: %w", err)
	}
	h, err := ParseHeader(b)
	if err != nil {
		return b, err
	}
	if h.Length < HeaderLen+trailerLen || h.Length > MaxCLCLen {
		return b, malformed("CLC length %d", h.Length)
	}
	b = append(b, make([]byte, int(h.Length)-HeaderLen)...)
	if _, err := io.ReadFull(r, b[HeaderLen:]); err != nil {
		return nil, fmt.Errorf("smcr: reading a %d-byte CLC message: %w", h.Length, err)
	}
	return b, nil
}

// checkFrame parses b's header and checks what every CLC message shares:
// the type, a length equal to len(b) and the trailer's eyecatcher.
func checkFrame(b []byte, typ byte, min int) (Header, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return h, err
	}
	switch {
	case h.Type != typ:
		return h, malformed("CLC type %d, want %d", h.Type, typ)
	case int(h.Length) != len(b):
		return h, malformed("CLC type %d: length field %d, message %d bytes", typ, h.Length, len(b))
	case len(b) < min:
		return h, malformed("CLC type %d: %d bytes, need at least %d", typ, len(b), min)
	}
	if t := [4]byte(b[len(b)-trailerLen:]); t != EyecatcherR && t != EyecatcherD {
		return h, malformed("CLC type %d: trailer % x", typ, t)
	}
	return h, nil
}

// finish patches the length into the message that starts at b[start] and
// appends the trailer.
func finish(b []byte, start int, eye [4]byte) []byte {
	b = append(b, eye[:]...)
	binary.BigEndian.PutUint16(b[start+5:], uint16(len(b)-start))
	return b
}

// EID is an enterprise ID (user or system), 32 bytes blank-padded.
type EID [32]byte

// MakeEID blank-pads name to an EID (truncating past 32 bytes), as the
// kernel stores the UEIDs it is given.
func MakeEID(name string) EID {
	var e EID
	for i := range e {
		e[i] = ' '
	}
	copy(e[:], name)
	return e
}

// IPPrefix is a version 1 proposal's IP area: the client's IPv4 subnet
// and its IPv6 prefixes.
type IPPrefix struct {
	Subnet [4]byte
	Len    uint8
	V6     []IPv6Prefix
}

// IPv6Prefix is one IPv6 prefix of an IPPrefix.
type IPv6Prefix struct {
	Prefix [16]byte
	Len    uint8
}

// V2Extension is a version 2 proposal's extension: the user EIDs the
// client shares, its RoCEv2 GID and link group limits (release 1).
type V2Extension struct {
	Release     uint8 // SMC release: 1 is v2.1 (max_conns, max_links, features)
	SEID        bool  // a system EID is offered (SMC-D)
	RoCEGID     [16]byte
	MaxConns    uint8
	MaxLinks    uint8
	FeatureMask uint16
	EIDs        []EID
	SMCD        *SMCDv2Extension // when TypeV2 offers SMC-D
}

// SMCDv2Extension is the SMC-Dv2 part of a proposal.
type SMCDv2Extension struct {
	SystemEID EID
	GIDCHIDs  []GIDCHID
}

// GIDCHID is an ISM device's GID and channel ID.
type GIDCHID struct {
	GID  uint64
	CHID uint16
}

// Proposal is a CLC proposal, the client's first message.
type Proposal struct {
	Eyecatcher     [4]byte
	Version        uint8
	TypeV1, TypeV2 SMCType
	PeerID         [8]byte // version 1 SMC-R: the client's system ID
	GID            [16]byte
	MAC            [6]byte
	ISMGID         uint64
	ISMCHID        uint16
	Prefix         *IPPrefix    // present when TypeV1 is not SMCTypeN
	V2             *V2Extension // present when TypeV2 is not SMCTypeN
}

// DecodeProposal decodes a whole CLC proposal, as the kernel finds its
// parts: the SMC-D area after the base, the IP prefix area at
// iparea_offset past the base, the v2 extension at v2_ext_offset past
// that field, the SMC-Dv2 extension at smcd_v2_ext_offset past its own.
func DecodeProposal(b []byte) (*Proposal, error) {
	h, err := checkFrame(b, TypeProposal, proposalBase+smcdAreaLen+trailerLen)
	if err != nil {
		return nil, err
	}
	be := binary.BigEndian
	body := b[:len(b)-trailerLen]
	p := &Proposal{Eyecatcher: h.Eyecatcher, Version: h.Version, TypeV1: h.TypeV1, TypeV2: h.TypeV2}
	copy(p.PeerID[:], b[8:])
	copy(p.GID[:], b[16:])
	copy(p.MAC[:], b[32:])
	p.ISMGID = be.Uint64(b[40:])
	p.ISMCHID = be.Uint16(b[48:])
	if p.TypeV1 != SMCTypeN {
		off := int(be.Uint16(b[38:]))
		if off > smcdAreaLen {
			return nil, malformed("proposal iparea_offset %d past the SMC-D area", off)
		}
		if p.Prefix, err = decodePrefix(body, proposalBase+off); err != nil {
			return nil, err
		}
	}
	if p.TypeV2 != SMCTypeN {
		if p.Version < 2 {
			return nil, malformed("proposal version %d offers a v2 type", p.Version)
		}
		off := int(be.Uint16(b[50:]))
		if off == 0 {
			return nil, malformed("proposal offers v2 without a v2 extension")
		}
		if p.V2, err = decodeV2Ext(body, 52+off, p.TypeV2.indicatesD()); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func decodePrefix(b []byte, at int) (*IPPrefix, error) {
	if at+prefixLen > len(b) {
		return nil, malformed("proposal IP prefix area at %d past the end (%d)", at, len(b))
	}
	p := &IPPrefix{Len: b[at+4]}
	copy(p.Subnet[:], b[at:])
	n := int(b[at+7])
	if n > maxV6Prefixes || at+prefixLen+n*ipv6PrefixLen > len(b) {
		return nil, malformed("proposal: %d IPv6 prefixes do not fit", n)
	}
	for i := range n {
		o := at + prefixLen + i*ipv6PrefixLen
		var q IPv6Prefix
		copy(q.Prefix[:], b[o:])
		q.Len = b[o+16]
		p.V6 = append(p.V6, q)
	}
	return p, nil
}

func decodeV2Ext(b []byte, at int, smcd bool) (*V2Extension, error) {
	if at+v2ExtFixedLen > len(b) {
		return nil, malformed("proposal v2 extension at %d past the end (%d)", at, len(b))
	}
	be := binary.BigEndian
	x := b[at:]
	v := &V2Extension{
		Release: x[3] >> 4, SEID: x[3]&1 != 0,
		MaxConns: x[24], MaxLinks: x[25], FeatureMask: be.Uint16(x[26:]),
	}
	copy(v.RoCEGID[:], x[8:])
	n := int(x[0])
	if n > maxUEIDs || v2ExtFixedLen+n*len(EID{}) > len(x) {
		return nil, malformed("proposal: %d user EIDs do not fit", n)
	}
	for i := range n {
		v.EIDs = append(v.EIDs, EID(x[v2ExtFixedLen+i*32:]))
	}
	if !smcd {
		return v, nil
	}
	d := at + 8 + int(be.Uint16(x[6:]))
	gids := int(x[1])
	if gids > maxISMGIDs || d+smcdV2FixedLen+gids*gidChidLen > len(b) {
		return nil, malformed("proposal SMC-Dv2 extension at %d with %d GIDs does not fit", d, gids)
	}
	v.SMCD = &SMCDv2Extension{SystemEID: EID(b[d:])}
	for i := range gids {
		o := d + smcdV2FixedLen + i*gidChidLen
		v.SMCD.GIDCHIDs = append(v.SMCD.GIDCHIDs, GIDCHID{GID: be.Uint64(b[o:]), CHID: be.Uint16(b[o+8:])})
	}
	return v, nil
}

// Append appends p's encoding, laid out as the kernel's
// smc_clc_send_proposal lays it out: the prefix area right after the
// SMC-D area, the v2 extension right after that, the SMC-Dv2 extension
// right after the EIDs. Prefix must be set when TypeV1 is not none and V2
// when TypeV2 is not; the counts are bounded as the kernel bounds them.
func (p *Proposal) Append(b []byte) ([]byte, error) {
	if (p.TypeV1 != SMCTypeN) != (p.Prefix != nil) || (p.TypeV2 != SMCTypeN) != (p.V2 != nil) {
		return b, fmt.Errorf("smcr: proposal types v1 %d v2 %d do not match its areas", p.TypeV1, p.TypeV2)
	}
	if p.V2 != nil && (len(p.V2.EIDs) > maxUEIDs || p.TypeV2.indicatesD() != (p.V2.SMCD != nil) ||
		p.V2.SMCD != nil && len(p.V2.SMCD.GIDCHIDs) > maxISMGIDs) {
		return b, errors.New("smcr: proposal v2 extension: too many EIDs or GIDs, or SMC-D part not matching TypeV2")
	}
	if p.Prefix != nil && len(p.Prefix.V6) > maxV6Prefixes {
		return b, fmt.Errorf("smcr: proposal has %d IPv6 prefixes, at most %d", len(p.Prefix.V6), maxV6Prefixes)
	}
	start := len(b)
	be := binary.BigEndian
	eye := orR(p.Eyecatcher)
	b = Header{Eyecatcher: eye, Type: TypeProposal, Version: p.Version, TypeV1: p.TypeV1, TypeV2: p.TypeV2}.appendTo(b)
	b = append(append(append(b, p.PeerID[:]...), p.GID[:]...), p.MAC[:]...)
	ipOff, v2Off := 0, 0
	if p.Prefix != nil {
		ipOff = smcdAreaLen
		v2Off = prefixLen + len(p.Prefix.V6)*ipv6PrefixLen
	}
	if p.V2 != nil {
		v2Off += smcdAreaLen - 12
	}
	b = be.AppendUint16(b, uint16(ipOff))
	b = be.AppendUint64(b, p.ISMGID)
	b = be.AppendUint16(b, p.ISMCHID)
	b = be.AppendUint16(b, uint16(v2Off))
	b = append(b, make([]byte, smcdAreaLen-12)...)
	if q := p.Prefix; q != nil {
		b = append(append(b, q.Subnet[:]...), q.Len, 0, 0, byte(len(q.V6)))
		for _, v6 := range q.V6 {
			b = append(append(b, v6.Prefix[:]...), v6.Len)
		}
	}
	if v := p.V2; v != nil {
		b = v.appendTo(b)
	}
	return finish(b, start, eye), nil
}

func (v *V2Extension) appendTo(b []byte) []byte {
	be := binary.BigEndian
	flag := v.Release << 4
	if v.SEID {
		flag |= 1
	}
	gids, smcdOff := 0, 0
	if v.SMCD != nil {
		gids = len(v.SMCD.GIDCHIDs)
		smcdOff = v2ExtFixedLen - 8 + len(v.EIDs)*len(EID{})
	}
	b = append(b, byte(len(v.EIDs)), byte(gids), 0, flag, 0, 0)
	b = be.AppendUint16(b, uint16(smcdOff))
	b = append(b, v.RoCEGID[:]...)
	b = append(b, v.MaxConns, v.MaxLinks)
	b = be.AppendUint16(b, v.FeatureMask)
	b = append(b, make([]byte, 12)...)
	for _, e := range v.EIDs {
		b = append(b, e[:]...)
	}
	if d := v.SMCD; d != nil {
		b = append(append(b, d.SystemEID[:]...), make([]byte, 16)...)
		for _, g := range d.GIDCHIDs {
			b = be.AppendUint16(be.AppendUint64(b, g.GID), g.CHID)
		}
	}
	return b
}

// FirstContactExt is the version 2 first-contact extension of an accept
// or confirm that starts a new link group; release 1 (v2.1) adds the
// link group limits and feature mask.
type FirstContactExt struct {
	V2Direct         bool  // the peers share a subnet (no gateway)
	OSType           uint8 // 1 z/OS, 2 Linux, 3 AIX
	Release          uint8
	Hostname         [32]byte
	MaxConns         uint8
	MaxLinks         uint8
	FeatureMask      uint16
	VendorExpOptions uint32
}

// OS types of a FirstContactExt or Decline.
const (
	OSZOS   = 1
	OSLinux = 2
	OSAIX   = 3
)

const (
	acceptV1Len = HeaderLen + 56 + trailerLen      // SMCR_CLC_ACCEPT_CONFIRM_LEN
	acceptV2Len = HeaderLen + 56 + 40 + trailerLen // SMCR_CLC_ACCEPT_CONFIRM_LEN_V2
	fceLen      = 36                               // the release 0 first-contact extension
	fceV2xLen   = 52                               // release 1 adds 16 bytes
	maxGIDs     = 8
)

// AcceptConfirm is an SMC-R CLC accept (the server's answer to a
// proposal) or confirm (the client's answer to the accept): the sender's
// QP and receive buffer.
type AcceptConfirm struct {
	Type         byte // TypeAccept or TypeConfirm
	Version      uint8
	FirstContact bool // a new link group: the QPs are to be set up
	PeerID       [8]byte
	GID          [16]byte
	MAC          [6]byte
	QPN          uint32 // 24 bits
	RMBRkey      uint32
	RMBEIdx      uint8
	AlertToken   uint32 // the connection's token
	RMBESize     uint8  // compressed: 0 is 16 KiB, each step doubles
	QPMTU        uint8  // IB MTU enum: 3 is 1024
	RMBAddr      uint64
	PSN          uint32 // 24 bits
	EID          EID    // version 2: the negotiated EID
	// FCE is version 2's first-contact extension, present exactly when
	// FirstContact is set in a version 2 message.
	FCE *FirstContactExt
	// GIDs is a version 2 first-contact confirm's list of the client's
	// RoCE GIDs (the kernel sends it only then).
	GIDs [][16]byte
}

// DecodeAcceptConfirm decodes a whole SMC-R CLC accept or confirm.
func DecodeAcceptConfirm(b []byte) (*AcceptConfirm, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	if h.Type != TypeAccept && h.Type != TypeConfirm {
		return nil, malformed("CLC type %d is no accept or confirm", h.Type)
	}
	if _, err := checkFrame(b, h.Type, acceptV1Len); err != nil {
		return nil, err
	}
	if h.TypeV1 != SMCTypeR {
		return nil, fmt.Errorf("%w: CLC accept/confirm of SMC type %d (only SMC-R)", ErrUnsupported, h.TypeV1)
	}
	be := binary.BigEndian
	m := &AcceptConfirm{Type: h.Type, Version: h.Version, FirstContact: h.TypeV2&2 != 0}
	r := b[HeaderLen:]
	copy(m.PeerID[:], r)
	copy(m.GID[:], r[8:])
	copy(m.MAC[:], r[24:])
	m.QPN = be24(r[30:])
	m.RMBRkey = be.Uint32(r[33:])
	m.RMBEIdx = r[37]
	m.AlertToken = be.Uint32(r[38:])
	m.RMBESize, m.QPMTU = r[42]>>4, r[42]&15
	m.RMBAddr = be.Uint64(r[44:])
	m.PSN = be24(r[53:])
	if m.Version < 2 {
		if len(b) != acceptV1Len {
			return nil, malformed("CLC v1 accept/confirm of %d bytes, want %d", len(b), acceptV1Len)
		}
		return m, nil
	}
	if len(b) < acceptV2Len {
		return nil, malformed("CLC v2 accept/confirm of %d bytes, need %d", len(b), acceptV2Len)
	}
	m.EID = EID(r[56:])
	rest := b[acceptV2Len-trailerLen : len(b)-trailerLen]
	if m.FirstContact {
		if rest, err = m.decodeFCE(rest); err != nil {
			return nil, err
		}
	}
	if len(rest) != 0 {
		return nil, malformed("CLC accept/confirm: %d bytes past its extensions", len(rest))
	}
	return m, nil
}

func (m *AcceptConfirm) decodeFCE(x []byte) ([]byte, error) {
	if len(x) < fceLen {
		return nil, malformed("CLC first-contact extension of %d bytes, need %d", len(x), fceLen)
	}
	f := &FirstContactExt{V2Direct: x[0]&0x80 != 0, OSType: x[1] >> 4, Release: x[1] & 15}
	copy(f.Hostname[:], x[4:])
	x = x[fceLen:]
	if f.Release >= 1 {
		if len(x) < fceV2xLen-fceLen {
			return nil, malformed("CLC release %d first-contact extension cut short", f.Release)
		}
		f.MaxConns, f.MaxLinks = x[0], x[1]
		f.FeatureMask = binary.BigEndian.Uint16(x[2:])
		f.VendorExpOptions = binary.BigEndian.Uint32(x[4:])
		x = x[fceV2xLen-fceLen:]
	}
	m.FCE = f
	if m.Type != TypeConfirm {
		return x, nil
	}
	if len(x) < 4 {
		return nil, malformed("CLC first-contact confirm without its GID list")
	}
	n := int(x[0])
	if n > maxGIDs || len(x) < 4+16*n {
		return nil, malformed("CLC confirm: %d GIDs do not fit", n)
	}
	for i := range n {
		m.GIDs = append(m.GIDs, [16]byte(x[4+16*i:]))
	}
	return x[4+16*n:], nil
}

// Append appends m's encoding as the kernel's smc_clc_send_confirm_accept
// builds it.
func (m *AcceptConfirm) Append(b []byte) ([]byte, error) {
	switch {
	case m.Type != TypeAccept && m.Type != TypeConfirm:
		return b, fmt.Errorf("smcr: accept/confirm of type %d", m.Type)
	case m.Version >= 2 && m.FirstContact != (m.FCE != nil):
		return b, errors.New("smcr: a v2 accept/confirm has a first-contact extension exactly when FirstContact is set")
	case len(m.GIDs) > maxGIDs || len(m.GIDs) > 0 && (m.Type != TypeConfirm || m.FCE == nil):
		return b, errors.New("smcr: GIDs go in a first-contact v2 confirm, at most 8")
	}
	be := binary.BigEndian
	start := len(b)
	var t2 SMCType
	if m.FirstContact {
		t2 = 2
	}
	b = Header{Eyecatcher: EyecatcherR, Type: m.Type, Version: m.Version, TypeV2: t2, TypeV1: SMCTypeR}.appendTo(b)
	b = append(append(append(b, m.PeerID[:]...), m.GID[:]...), m.MAC[:]...)
	b = append24(b, m.QPN)
	b = be.AppendUint32(b, m.RMBRkey)
	b = append(b, m.RMBEIdx)
	b = be.AppendUint32(b, m.AlertToken)
	b = append(b, m.RMBESize<<4|m.QPMTU&15, 0)
	b = be.AppendUint64(b, m.RMBAddr)
	b = append24(append(b, 0), m.PSN)
	if m.Version >= 2 {
		b = append(append(b, m.EID[:]...), make([]byte, 8)...)
		if f := m.FCE; f != nil {
			b = f.appendTo(b)
			if m.Type == TypeConfirm {
				b = append(b, byte(len(m.GIDs)), 0, 0, 0)
				for _, g := range m.GIDs {
					b = append(b, g[:]...)
				}
			}
		}
	}
	return finish(b, start, EyecatcherR), nil
}

func (f *FirstContactExt) appendTo(b []byte) []byte {
	var d byte
	if f.V2Direct {
		d = 0x80
	}
	b = append(b, d, f.OSType<<4|f.Release&15, 0, 0)
	b = append(b, f.Hostname[:]...)
	if f.Release >= 1 {
		b = append(b, f.MaxConns, f.MaxLinks)
		b = binary.BigEndian.AppendUint16(b, f.FeatureMask)
		b = binary.BigEndian.AppendUint32(b, f.VendorExpOptions)
		b = append(b, make([]byte, 8)...)
	}
	return b
}

const (
	declineV1Len = 28 // struct smc_clc_msg_decline
	declineV2Len = 44 // struct smc_clc_msg_decline_v2
)

// Decline is a CLC decline: the sender falls back to TCP, and says why.
type Decline struct {
	Eyecatcher [4]byte
	Version    uint8
	OutOfSync  bool // the first-contact bit: the sender's link group is out of sync
	PeerID     [8]byte
	Diagnosis  uint32 // one of the Decline* codes
	OSType     uint8
	// More holds a version 2 decline's further diagnosis codes; a
	// 28-byte (version 1 sized) decline has none.
	More *[4]uint32
}

// DecodeDecline decodes a whole CLC decline, of either size.
func DecodeDecline(b []byte) (*Decline, error) {
	h, err := checkFrame(b, TypeDecline, declineV1Len)
	if err != nil {
		return nil, err
	}
	if len(b) != declineV1Len && len(b) != declineV2Len {
		return nil, malformed("CLC decline of %d bytes, want %d or %d", len(b), declineV1Len, declineV2Len)
	}
	be := binary.BigEndian
	d := &Decline{Eyecatcher: h.Eyecatcher, Version: h.Version, OutOfSync: h.TypeV2&2 != 0,
		Diagnosis: be.Uint32(b[16:]), OSType: b[20] >> 4}
	copy(d.PeerID[:], b[8:])
	if len(b) == declineV2Len {
		var more [4]uint32
		for i := range more {
			more[i] = be.Uint32(b[24+4*i:])
		}
		d.More = &more
	}
	return d, nil
}

// Append appends d's encoding.
func (d *Decline) Append(b []byte) []byte {
	start := len(b)
	var t2 SMCType
	if d.OutOfSync {
		t2 = 2
	}
	eye := orR(d.Eyecatcher)
	b = Header{Eyecatcher: eye, Type: TypeDecline, Version: d.Version, TypeV2: t2}.appendTo(b)
	b = append(b, d.PeerID[:]...)
	b = binary.BigEndian.AppendUint32(b, d.Diagnosis)
	b = append(b, d.OSType<<4, 0, 0, 0)
	if d.More != nil {
		for _, c := range d.More {
			b = binary.BigEndian.AppendUint32(b, c)
		}
	}
	return finish(b, start, eye)
}

// orR is eye, or SMC-R's eyecatcher when eye was left unset.
func orR(eye [4]byte) [4]byte {
	if eye == ([4]byte{}) {
		return EyecatcherR
	}
	return eye
}

func be24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

func append24(b []byte, v uint32) []byte { return append(b, byte(v>>16), byte(v>>8), byte(v)) }
