package smcr

import (
	"encoding/binary"
	"fmt"
)

// LLC message types: the low nibble of the first byte, whose high nibble
// is the LLC version (0 or 2). CDC messages share the first byte's space.
const (
	LLCConfirmLink  byte = 0x01
	LLCAddLink      byte = 0x02
	LLCAddLinkCont  byte = 0x03
	LLCDeleteLink   byte = 0x04
	LLCRequestAdd   byte = 0x05
	LLCConfirmRkey  byte = 0x06
	LLCTestLink     byte = 0x07
	LLCConfirmRkeyC byte = 0x08
	LLCDeleteRkey   byte = 0x09
	CDCType         byte = 0xfe
)

// LLC header flags.
const (
	LLCFlagResp          = 0x80 // a response to the peer's request
	LLCFlagNoRMBEEyeC    = 0x03 // CONFIRM_LINK: no eyecatcher in the RMBE
	LLCFlagAddLinkReject = 0x40 // ADD_LINK response: rejected
	LLCFlagDelLinkAll    = 0x40 // DELETE_LINK: the whole link group
	LLCFlagDelLinkOrdly  = 0x20 // DELETE_LINK: orderly
)

// LLCLen is the size of an LLC or CDC message in its version 1 form, and
// of every version 2 message but ADD_LINK's.
const LLCLen = 44

// LLCHeader is an LLC message's 4-byte header.
type LLCHeader struct {
	Type    byte  // LLCConfirmLink...
	Version uint8 // 0 (SMC-Rv1) or 2
	Length  uint16
	// Reject is a version 1 ADD_LINK response's reject reason (the low
	// nibble of the second length byte, which version 2 uses for the
	// length).
	Reject uint8
	Flags  uint8
}

// ParseLLCHeader decodes the header of the LLC message b, checking that
// its length field is len(b) (in a version 2 header, in either byte
// order).
func ParseLLCHeader(b []byte) (LLCHeader, error) {
	if len(b) < 4 {
		return LLCHeader{}, malformed("LLC message of %d bytes", len(b))
	}
	h := LLCHeader{Type: b[0] & 15, Version: b[0] >> 4, Flags: b[3]}
	switch h.Version {
	case 0:
		h.Length, h.Reject = uint16(b[1]), b[2]&15
	case 2:
		h.Length = binary.LittleEndian.Uint16(b[1:])
		if int(h.Length) != len(b) {
			h.Length = binary.BigEndian.Uint16(b[1:])
		}
	default:
		return h, malformed("LLC version %d", h.Version)
	}
	if int(h.Length) != len(b) {
		return h, malformed("LLC type %d: length field %d, message %d bytes", h.Type, h.Length, len(b))
	}
	return h, nil
}

func (h LLCHeader) appendTo(b []byte) []byte {
	b = append(b, h.Version<<4|h.Type&15)
	if h.Version == 2 {
		b = binary.LittleEndian.AppendUint16(b, h.Length)
	} else {
		b = append(b, byte(h.Length), h.Reject&15)
	}
	return append(b, h.Flags)
}

// LLCMessage is an LLC message this package decodes.
type LLCMessage interface {
	// Append appends the message's encoding.
	Append(b []byte) []byte
}

// DecodeLLC decodes the LLC message b (one SEND's payload) by its type:
// *ConfirmLink, *AddLink, *DeleteLink, *DeleteRkey or *TestLink; other
// types are ErrUnsupported.
func DecodeLLC(b []byte) (LLCMessage, error) {
	h, err := ParseLLCHeader(b)
	if err != nil {
		return nil, err
	}
	switch h.Type {
	case LLCConfirmLink:
		return decodeConfirmLink(h, b)
	case LLCAddLink:
		return decodeAddLink(h, b)
	case LLCDeleteLink:
		return decodeDeleteLink(h, b)
	case LLCDeleteRkey:
		return decodeDeleteRkey(h, b)
	case LLCTestLink:
		return decodeTestLink(h, b)
	}
	return nil, fmt.Errorf("%w: LLC type %d", ErrUnsupported, h.Type)
}

func fixedLen(h LLCHeader, b []byte) error {
	if len(b) != LLCLen {
		return malformed("LLC type %d of %d bytes, want %d", h.Type, len(b), LLCLen)
	}
	return nil
}

// ConfirmLink is CONFIRM_LINK: the server's first message on a new link
// (request), and the client's answer (response), naming the sender's QP.
type ConfirmLink struct {
	Version   uint8
	Flags     uint8
	SenderMAC [6]byte
	SenderGID [16]byte
	SenderQPN uint32
	LinkNum   uint8
	LinkUID   [4]byte
	MaxLinks  uint8
	MaxConns  uint8
}

func decodeConfirmLink(h LLCHeader, b []byte) (*ConfirmLink, error) {
	if err := fixedLen(h, b); err != nil {
		return nil, err
	}
	m := &ConfirmLink{Version: h.Version, Flags: h.Flags, SenderQPN: be24(b[26:]), LinkNum: b[29],
		MaxLinks: b[34], MaxConns: b[35]}
	copy(m.SenderMAC[:], b[4:])
	copy(m.SenderGID[:], b[10:])
	copy(m.LinkUID[:], b[30:])
	return m, nil
}

// Append implements LLCMessage.
func (m *ConfirmLink) Append(b []byte) []byte {
	b = LLCHeader{Type: LLCConfirmLink, Version: m.Version, Length: LLCLen, Flags: m.Flags}.appendTo(b)
	b = append(append(b, m.SenderMAC[:]...), m.SenderGID[:]...)
	b = append(append24(b, m.SenderQPN), m.LinkNum)
	b = append(append(b, m.LinkUID[:]...), m.MaxLinks, m.MaxConns)
	return append(b, make([]byte, 8)...)
}

// AddLink is ADD_LINK: a request for a second link on another QP (the
// kernel's server sends one right after the first link is confirmed when
// max_links allows), or the answer. Version 2 appends the rkeys of the
// link group's buffers as the new link sees them.
type AddLink struct {
	Version     uint8
	Flags       uint8
	Reject      uint8 // version 1 response: the reject reason
	SenderMAC   [6]byte
	SenderGID   [16]byte
	SenderQPN   uint32
	LinkNum     uint8
	QPMTU       uint8
	InitialPSN  uint32
	InitCredits uint8
	V2          *AddLinkV2 // version 2 only
}

// AddLinkV2 is ADD_LINK's version 2 extension.
type AddLinkV2 struct {
	V2Direct        bool
	ClientTargetGID [16]byte
	Rkeys           []AddLinkRkey
}

// AddLinkRkey maps one buffer's rkey on the existing link to its rkey
// and address on the new one.
type AddLinkRkey struct {
	RMBKey    uint32
	RMBKeyNew uint32
	RMBVaddr  uint64
}

const addLinkV2Fixed = 28 // v2_direct, reserved, target GID, reserved[8], num_rkeys

func decodeAddLink(h LLCHeader, b []byte) (*AddLink, error) {
	if len(b) < LLCLen || h.Version != 2 && len(b) != LLCLen {
		return nil, malformed("ADD_LINK of %d bytes", len(b))
	}
	m := &AddLink{Version: h.Version, Flags: h.Flags, Reject: h.Reject, SenderQPN: be24(b[28:]),
		LinkNum: b[31], QPMTU: b[32] & 15, InitialPSN: be24(b[33:]), InitCredits: b[36]}
	copy(m.SenderMAC[:], b[4:])
	copy(m.SenderGID[:], b[12:])
	if h.Version != 2 {
		return m, nil
	}
	x := b[LLCLen:]
	if len(x) < addLinkV2Fixed {
		return nil, malformed("ADD_LINK v2 extension of %d bytes", len(x))
	}
	v := &AddLinkV2{V2Direct: x[0]&0x80 != 0, ClientTargetGID: [16]byte(x[2:])}
	// num_rkeys is a host-order u16 too, like the v2 header's length.
	n := int(binary.LittleEndian.Uint16(x[26:]))
	if len(x) != addLinkV2Fixed+16*n {
		n = int(binary.BigEndian.Uint16(x[26:]))
	}
	if len(x) != addLinkV2Fixed+16*n {
		return nil, malformed("ADD_LINK v2: %d rkeys in %d bytes", n, len(x))
	}
	for i := range n {
		r := x[addLinkV2Fixed+16*i:]
		be := binary.BigEndian
		v.Rkeys = append(v.Rkeys, AddLinkRkey{RMBKey: be.Uint32(r), RMBKeyNew: be.Uint32(r[4:]), RMBVaddr: be.Uint64(r[8:])})
	}
	m.V2 = v
	return m, nil
}

// Append implements LLCMessage. A version 2 ADD_LINK always carries its
// extension (an empty one when V2 is nil).
func (m *AddLink) Append(b []byte) []byte {
	v := m.V2
	if v == nil {
		v = &AddLinkV2{}
	}
	n := LLCLen
	if m.Version == 2 {
		n += addLinkV2Fixed + 16*len(v.Rkeys)
	}
	b = LLCHeader{Type: LLCAddLink, Version: m.Version, Length: uint16(n), Reject: m.Reject, Flags: m.Flags}.appendTo(b)
	b = append(append(append(b, m.SenderMAC[:]...), 0, 0), m.SenderGID[:]...)
	b = append(append24(b, m.SenderQPN), m.LinkNum, m.QPMTU&15)
	b = append(append24(b, m.InitialPSN), m.InitCredits)
	b = append(b, make([]byte, 7)...)
	if m.Version != 2 {
		return b
	}
	var d byte
	if v.V2Direct {
		d = 0x80
	}
	b = append(append(append(b, d, 0), v.ClientTargetGID[:]...), make([]byte, 8)...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(v.Rkeys)))
	for _, r := range v.Rkeys {
		b = binary.BigEndian.AppendUint32(b, r.RMBKey)
		b = binary.BigEndian.AppendUint32(b, r.RMBKeyNew)
		b = binary.BigEndian.AppendUint64(b, r.RMBVaddr)
	}
	return b
}

// DeleteLink is DELETE_LINK: one link (LinkNum) or, with
// LLCFlagDelLinkAll, the whole link group goes; Reason is why.
type DeleteLink struct {
	Version uint8
	Flags   uint8
	LinkNum uint8
	Reason  uint32
}

// DELETE_LINK reasons (smc_llc.h).
const (
	DelLinkLostPath = 0x00010000
	DelLinkOpInit   = 0x00020000
	DelLinkProgFlt  = 0x00030000
	DelLinkNoActive = 0x00040000
	DelLinkNoAltern = 0x00050000
	DelLinkTimeout  = 0x00060000
)

func decodeDeleteLink(h LLCHeader, b []byte) (*DeleteLink, error) {
	if err := fixedLen(h, b); err != nil {
		return nil, err
	}
	return &DeleteLink{Version: h.Version, Flags: h.Flags, LinkNum: b[4], Reason: binary.BigEndian.Uint32(b[5:])}, nil
}

// Append implements LLCMessage.
func (m *DeleteLink) Append(b []byte) []byte {
	b = LLCHeader{Type: LLCDeleteLink, Version: m.Version, Length: LLCLen, Flags: m.Flags}.appendTo(b)
	b = binary.BigEndian.AppendUint32(append(b, m.LinkNum), m.Reason)
	return append(b, make([]byte, 35)...)
}

// DeleteRkey is DELETE_RKEY: the sender freed the buffers with these
// rkeys (the kernel sends it when a link group's buffer is released); a
// response echoes the count and, in ErrMask, which it could not delete.
type DeleteRkey struct {
	Version uint8
	Flags   uint8
	ErrMask uint8 // version 2: the number of rkeys not deleted
	Rkeys   []uint32
}

func decodeDeleteRkey(h LLCHeader, b []byte) (*DeleteRkey, error) {
	if len(b) < LLCLen {
		return nil, malformed("DELETE_RKEY of %d bytes", len(b))
	}
	n := int(b[4])
	if 8+4*n > len(b) || h.Version != 2 && n > 8 {
		return nil, malformed("DELETE_RKEY: %d rkeys in %d bytes", n, len(b))
	}
	m := &DeleteRkey{Version: h.Version, Flags: h.Flags, ErrMask: b[5], Rkeys: make([]uint32, n)}
	for i := range n {
		m.Rkeys[i] = binary.BigEndian.Uint32(b[8+4*i:])
	}
	return m, nil
}

// Append implements LLCMessage: 44 bytes for up to 8 rkeys, as long as
// the list needs beyond that (version 2).
func (m *DeleteRkey) Append(b []byte) []byte {
	n := max(LLCLen, 8+4*len(m.Rkeys))
	start := len(b)
	b = LLCHeader{Type: LLCDeleteRkey, Version: m.Version, Length: uint16(n), Flags: m.Flags}.appendTo(b)
	b = append(b, byte(len(m.Rkeys)), m.ErrMask, 0, 0)
	for _, k := range m.Rkeys {
		b = binary.BigEndian.AppendUint32(b, k)
	}
	return append(b, make([]byte, n-(len(b)-start))...)
}

// TestLink is TEST_LINK: a keepalive on an idle link, echoed with its
// user data.
type TestLink struct {
	Version  uint8
	Flags    uint8
	UserData [16]byte
}

func decodeTestLink(h LLCHeader, b []byte) (*TestLink, error) {
	if err := fixedLen(h, b); err != nil {
		return nil, err
	}
	return &TestLink{Version: h.Version, Flags: h.Flags, UserData: [16]byte(b[4:])}, nil
}

// Append implements LLCMessage.
func (m *TestLink) Append(b []byte) []byte {
	b = LLCHeader{Type: LLCTestLink, Version: m.Version, Length: LLCLen, Flags: m.Flags}.appendTo(b)
	return append(append(b, m.UserData[:]...), make([]byte, 24)...)
}
