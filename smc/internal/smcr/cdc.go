package smcr

import "encoding/binary"

// Cursor is a position in a connection's receive buffer (RMBE): how many
// times the writer wrapped around it, and the offset in it.
type Cursor struct {
	Wrap  uint16
	Count uint32
}

// CDC producer flags.
const (
	CDCWriteBlocked  = 0x80 // the sender waits for room in the peer's buffer
	CDCUrgPending    = 0x40
	CDCUrgPresent    = 0x20
	CDCCursorRequest = 0x10 // the sender asks for a consumer cursor update
	CDCFailoverValid = 0x08
)

// CDC connection state flags.
const (
	CDCPeerDoneWriting = 0x80 // the sender shut down writing
	CDCPeerConnClosed  = 0x40 // the sender closed the connection
	CDCPeerConnAbort   = 0x20 // the sender aborted the connection
)

// CDC is a CDC message: after RDMA WRITEs into the peer's buffer, the
// sender's producer cursor (where its writes end), its consumer cursor
// (how far it read the peer's writes) and flags, for the connection whose
// alert token is Token.
type CDC struct {
	Seq        uint16
	Token      uint32
	Prod, Cons Cursor
	ProdFlags  uint8
	ConnFlags  uint8
}

// DecodeCDC decodes a CDC message (one 44-byte SEND's payload).
func DecodeCDC(b []byte) (*CDC, error) {
	if len(b) != LLCLen || b[0] != CDCType || b[1] != LLCLen {
		return nil, malformed("CDC message: % x...", b[:min(len(b), 2)])
	}
	be := binary.BigEndian
	return &CDC{
		Seq: be.Uint16(b[2:]), Token: be.Uint32(b[4:]),
		Prod:      Cursor{Wrap: be.Uint16(b[10:]), Count: be.Uint32(b[12:])},
		Cons:      Cursor{Wrap: be.Uint16(b[18:]), Count: be.Uint32(b[20:])},
		ProdFlags: b[24], ConnFlags: b[25],
	}, nil
}

// Append appends m's 44 bytes.
func (m *CDC) Append(b []byte) []byte {
	be := binary.BigEndian
	b = be.AppendUint32(be.AppendUint16(append(b, CDCType, LLCLen), m.Seq), m.Token)
	for _, c := range []Cursor{m.Prod, m.Cons} {
		b = be.AppendUint32(be.AppendUint16(append(b, 0, 0), c.Wrap), c.Count)
	}
	return append(append(b, m.ProdFlags, m.ConnFlags), make([]byte, 18)...)
}
