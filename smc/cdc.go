package smc

import (
	"encoding/binary"
	"fmt"
)

// A CDC (connection data control) message of RFC 7609: 44 bytes sent as
// a two-sided SEND to the peer's port, carrying the sender's producer and
// consumer cursors (wrap sequence and offset into the receiver's buffer)
// and the flags of the connection's state.
const (
	cdcType = 0xfe
	cdcLen  = 44
)

// Producer flags.
const (
	flagWriteBlocked  = 0x80 // the sender waits for window
	flagUrgPending    = 0x40
	flagUrgPresent    = 0x20
	flagCursorRequest = 0x10 // the sender asks for a consumer cursor update
	// flagWindowLag (not in RFC 7609): the sender's last wait for window
	// was long (lagWait): the time the cursor takes to come back bounds
	// the stream, and a larger buffer would carry more meanwhile.
	flagWindowLag = 0x08
)

// Connection state flags.
const (
	flagDoneWriting = 0x80 // the sender writes no more (CloseWrite)
	flagConnClosed  = 0x40 // the sender closed the connection
	flagAbnormal    = 0x20 // the sender aborted the connection
	// flagMoved (not in RFC 7609, whose buffers keep their size): the
	// sender WRITEs into the buffer the receiver moved to (moveMsg) from
	// this message's producer cursor on.
	flagMoved = 0x10
)

// cursorSpan is the ring size cursors are counted in between krcore
// peers: a cursor is the stream position as wraps of 4 GiB and the
// offset, so that it means the same whichever buffer the bytes are in
// (a receiver's buffer may move, moveMsg); each side maps it to its
// buffers.
const cursorSpan = 1 << 32

// cursor is a position in a ring of size bytes: the number of times it
// wrapped and the offset into it.
type cursor struct {
	wrap  uint16
	count uint32
}

// toCursor maps a byte count since the connection began to its cursor in
// a ring of size bytes.
func toCursor(n uint64, size int) cursor {
	return cursor{wrap: uint16(n / uint64(size)), count: uint32(n % uint64(size))}
}

// fromCursor maps c back to a byte count, the one nearest near (the last
// count known): the wrap sequence is 16 bits and wraps itself.
func fromCursor(c cursor, size int, near uint64) uint64 {
	period := uint64(size) << 16
	base := near - near%period
	v := base + uint64(c.wrap)*uint64(size) + uint64(c.count)
	// Pick among v-period, v, v+period the one closest to near.
	switch {
	case v > near && v-near > period/2 && v >= period:
		v -= period
	case v < near && near-v > period/2:
		v += period
	}
	return v
}

// cdcMsg is a CDC message's content. key (in RFC 7609's reserved bytes)
// is the receiver's connection's secret, from its CLC message: the token
// alone is 32 bits a third process on the peer's node could guess, one
// SEND a guess, to move the connection's cursors or close it.
type cdcMsg struct {
	seq        uint16
	token      uint32
	key        uint64
	prod, cons cursor
	prodFlags  byte
	connFlags  byte
}

func (m *cdcMsg) encode(b []byte) []byte {
	b = b[:cdcLen]
	clear(b)
	be := binary.BigEndian
	b[0], b[1] = cdcType, cdcLen
	be.PutUint16(b[2:], m.seq)
	be.PutUint32(b[4:], m.token)
	be.PutUint16(b[10:], m.prod.wrap)
	be.PutUint32(b[12:], m.prod.count)
	be.PutUint16(b[18:], m.cons.wrap)
	be.PutUint32(b[20:], m.cons.count)
	b[24], b[25] = m.prodFlags, m.connFlags
	be.PutUint64(b[cdcKeyAt:], m.key)
	return b
}

// cdcKeyAt is where a CDC message's key lies, in RFC 7609's reserved
// bytes after the flags.
const cdcKeyAt = 28

// moveMsg tells a sender that its receiver offers a buffer of its own
// (an RMB element, named as in an accept) to move to: the receiver's
// peer waited for window again and again. The sender moves at a point of
// its choosing, telling the receiver with flagMoved.
type moveMsg struct {
	token     uint32 // the sender's token, which the message goes to
	key       uint64 // and its key (cdcMsg)
	off, size uint32
	name      string
}

const (
	moveType = 0xfd
	moveHdr  = 23 // type, length, token, offset, size, key, name length
	moveMax  = moveHdr + maxName
)

func (m *moveMsg) encode(b []byte) []byte {
	b = b[:moveHdr+len(m.name)]
	be := binary.BigEndian
	b[0], b[1] = moveType, byte(len(b))
	be.PutUint32(b[2:], m.token)
	be.PutUint32(b[6:], m.off)
	be.PutUint32(b[10:], m.size)
	be.PutUint64(b[14:], m.key)
	b[moveHdr-1] = byte(len(m.name))
	copy(b[moveHdr:], m.name)
	return b
}

func decodeMove(b []byte) (moveMsg, error) {
	if len(b) < moveHdr || len(b) > moveMax || b[0] != moveType || int(b[1]) != len(b) || len(b) != moveHdr+int(b[moveHdr-1]) {
		return moveMsg{}, fmt.Errorf("smc: a malformed buffer move message of %d bytes", len(b))
	}
	be := binary.BigEndian
	return moveMsg{token: be.Uint32(b[2:]), off: be.Uint32(b[6:]), size: be.Uint32(b[10:]), key: be.Uint64(b[14:]),
		name: string(b[moveHdr:])}, nil
}

func decodeCDC(b []byte) (cdcMsg, bool) {
	if len(b) != cdcLen || b[0] != cdcType || b[1] != cdcLen {
		return cdcMsg{}, false
	}
	be := binary.BigEndian
	return cdcMsg{
		seq: be.Uint16(b[2:]), token: be.Uint32(b[4:]), key: be.Uint64(b[cdcKeyAt:]),
		prod:      cursor{wrap: be.Uint16(b[10:]), count: be.Uint32(b[12:])},
		cons:      cursor{wrap: be.Uint16(b[18:]), count: be.Uint32(b[20:])},
		prodFlags: b[24], connFlags: b[25],
	}, true
}
