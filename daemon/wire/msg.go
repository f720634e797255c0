package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// Version is the protocol version OpHello carries.
const Version = 1

// Features is what this daemon does beyond the first protocol, a bit
// each, sent after OpHello's response fields: a client that finds no word
// there speaks to a daemon of the first protocol (Version stays 1, so
// that old clients and daemons keep attaching to new ones).
const Features = FeatureClientAny | FeatureQueueTo | FeatureForget

// Feature bits.
const (
	// FeatureClientAny: the daemon rings the message bell for completions
	// while ClientAny is above zero and the client sleeps on that bell.
	FeatureClientAny = 1 << iota
	// FeatureQueueTo: OpQueue may carry a body, and then the daemon
	// connects the new queue and looks a region up before it answers.
	FeatureQueueTo
	// FeatureForget: the daemon takes OpForget.
	FeatureForget
)

// Op names a control message.
type Op uint8

// Control messages; the comment is the request's body, then the response's.
const (
	OpHello      Op = iota + 1 // u32 version; u64 client id, u64 node, u32 credits, u32 max message[, u32 features]
	OpRegister                 // fd memfd, u64 offset, u64 len, u32 access; u64 mr
	OpDeregister               // u64 mr; -
	OpExport                   // str name, u64 mr, u64 off, u64 len, u32 access[, u32 k, k of (u64 node, u32 port)]; -
	OpUnexport                 // str name; -
	OpRegion                   // u64 node, str name; u64 region, u64 len, u32 access, u64 0 (reserved)
	OpQueue                    // fds ring memfd, doorbell, completion bell, message bell[, control bell][; u64 node, u8 to port, u32 port, str name]; u64 vq[, as OpVQRegion's if name]
	OpConnect                  // u64 vq, u64 node, u8 to port, u32 port; -
	OpBind                     // u64 vq, u32 port; -
	OpUnbind                   // u64 vq; -
	OpCloseVQ                  // u64 vq; -
	OpStats                    // -; the fields of krcore.Stats as u64s (PutStats)
	OpStatus                   // -; str JSON (Status)
	OpBye                      // daemon to client, unasked: str reason
	OpVQRegion                 // u64 vq, str name; as OpRegion, asking as the port the VQ is bound to
	OpReport                   // str name, str JSON (empty: withdraw); - (see Report)
	OpReports                  // str prefix, u32 skip; u32 total, u32 k, k of PutReport's entry
	OpForget                   // u64 region; - (FeatureForget)
)

// HeaderLen is the length of a control message's header.
const HeaderLen = 16

// MaxMessage bounds a control message.
const MaxMessage = 64 << 10

// Error codes.
const (
	CodeOK = iota
	CodeOther
	CodeClosed
	CodeNotConnected
	CodePortInUse
	CodeNoRegion
	CodeUnreachable
	CodeRefused
	CodeInvalid
	CodeBusy
	CodeDeadline
	CodeLimit
	CodeCanceled
)

// codes maps the first protocol's codes to the errors they stand for; the
// body after the text carries every sentinel (see errors.go).
var codes = map[uint8]error{
	CodeClosed: krcore.ErrClosed, CodeNotConnected: krcore.ErrNotConnected, CodePortInUse: krcore.ErrPortInUse,
	CodeNoRegion: krcore.ErrNoRegion, CodeUnreachable: krcore.ErrUnreachable, CodeRefused: krcore.ErrRefused,
	CodeInvalid: verbs.ErrInvalid, CodeBusy: verbs.ErrBusy, CodeDeadline: context.DeadlineExceeded,
	CodeLimit: verbs.ErrLimit, CodeCanceled: context.Canceled,
}

// ErrMalformed reports a control message that does not parse.
var ErrMalformed = errors.New("wire: malformed message")

// Msg is a control message being built or read.
type Msg struct {
	Op   Op
	Code uint8
	Seq  uint64
	// FDs are the descriptors the message carries. A receiver that keeps
	// one sets its entry to -1 (CloseFDs closes the rest), or nil for all.
	FDs []int
	b   []byte // the body
	off int    // read position in b
	err error  // the first decoding error
}

// NewMsg starts a message.
func NewMsg(op Op, seq uint64) *Msg { return &Msg{Op: op, Seq: seq} }

// Bytes is the message as sent.
func (m *Msg) Bytes() []byte {
	b := make([]byte, HeaderLen, HeaderLen+len(m.b))
	b[0], b[1] = byte(m.Op), m.Code
	binary.LittleEndian.PutUint64(b[8:], m.Seq)
	return append(b, m.b...)
}

// Parse reads a received message.
func Parse(b []byte, fds []int) (*Msg, error) {
	if len(b) < HeaderLen {
		return nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	return &Msg{Op: Op(b[0]), Code: b[1], Seq: binary.LittleEndian.Uint64(b[8:]), b: b[HeaderLen:], FDs: fds}, nil
}

// U8 appends a byte.
func (m *Msg) U8(v uint8) *Msg { m.b = append(m.b, v); return m }

// U32 appends a u32.
func (m *Msg) U32(v uint32) *Msg { m.b = binary.LittleEndian.AppendUint32(m.b, v); return m }

// U64 appends a u64.
func (m *Msg) U64(v uint64) *Msg { m.b = binary.LittleEndian.AppendUint64(m.b, v); return m }

// Str appends a string (truncated to 64 KiB).
func (m *Msg) Str(s string) *Msg {
	s = s[:min(len(s), 0xffff)]
	m.b = binary.LittleEndian.AppendUint16(m.b, uint16(len(s)))
	m.b = append(m.b, s...)
	return m
}

func (m *Msg) take(n int) []byte {
	if m.err != nil || len(m.b)-m.off < n {
		if m.err == nil {
			m.err = fmt.Errorf("%w: op %d: short body: %w", ErrMalformed, m.Op, verbs.ErrInvalid)
		}
		return make([]byte, n)
	}
	b := m.b[m.off : m.off+n]
	m.off += n
	return b
}

// GetU8 reads a byte.
func (m *Msg) GetU8() uint8 { return m.take(1)[0] }

// GetU32 reads a u32.
func (m *Msg) GetU32() uint32 { return binary.LittleEndian.Uint32(m.take(4)) }

// GetU64 reads a u64.
func (m *Msg) GetU64() uint64 { return binary.LittleEndian.Uint64(m.take(8)) }

// GetStr reads a string.
func (m *Msg) GetStr() string {
	n := binary.LittleEndian.Uint16(m.take(2))
	return string(m.take(int(n)))
}

// More reports whether the body has bytes left to read (an optional
// trailing field).
func (m *Msg) More() bool { return m.err == nil && m.off < len(m.b) }

// Err is the first decoding error.
func (m *Msg) Err() error { return m.err }

// Reply starts the response to m.
func (m *Msg) Reply() *Msg { return &Msg{Op: m.Op, Seq: m.Seq} }

// Fail makes m an error response carrying err: its text and identity.
func (m *Msg) Fail(err error) *Msg {
	m.Code, m.b = ErrorCode(err), nil
	return m.putError(err, MaxMessage/4)
}

// Error returns the error a response carries, or nil.
func (m *Msg) Error() error {
	if m.Code == CodeOK {
		return nil
	}
	return m.getError(m.Code)
}
