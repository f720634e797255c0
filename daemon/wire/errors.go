package wire

import (
	"encoding/binary"
	"errors"

	"github.com/krcore/krcore/internal/errid"
	"github.com/krcore/krcore/verbs"
)

// An error crosses the socket (a response with a code other than CodeOK)
// or the ring (a control SQE's outcome, see Ring.PutCtlErr) as its text
// followed by what errors.Is and errors.As can learn about it:
//
//	str  the error's text (err.Error())
//	u8   n, then n strs: the names of the sentinels it matches (the
//	     table of internal/errid)
//	u8   1 if it matches a verbs.Status, then u32 the status
//	u8   1 if it matches a *verbs.CompletionError, then u64 ID, u32 QPN,
//	     u32 status
//
// The code in the header is the first sentinel of the first protocol it
// matches, so a client that reads only the text still gets that one. Names,
// not indices, so two builds with different tables agree on what both know.

// ErrRemote wraps every error the daemon reported.
var ErrRemote = errors.New("krcored")

// Error is an error the daemon reported: "krcored: " and the daemon's
// text. It matches (errors.Is, errors.As) ErrRemote and the sentinels,
// verbs.Status and *verbs.CompletionError the daemon's error matched.
type Error = errid.Error

// ErrorCode is the code of the first protocol that carries err (CodeOK for
// nil): the first of its sentinels err matches.
func ErrorCode(err error) uint8 {
	if err == nil {
		return CodeOK
	}
	for _, c := range []uint8{CodeClosed, CodeNotConnected, CodePortInUse, CodeNoRegion, CodeUnreachable,
		CodeRefused, CodeInvalid, CodeBusy, CodeDeadline, CodeLimit, CodeCanceled} {
		if errors.Is(err, codes[c]) {
			return c
		}
	}
	return CodeOther
}

// CodeError rebuilds an error from its code and text alone, as a daemon of
// the first protocol sent it.
func CodeError(code uint8, text string) error {
	wrapped := []error{ErrRemote}
	if s := codes[code]; s != nil {
		wrapped = append(wrapped, s)
	}
	return errid.Identity{}.Err("krcored: "+text, wrapped...)
}

// putError appends err's text and identity to m's body.
func (m *Msg) putError(err error, maxText int) *Msg {
	text := err.Error()
	m.Str(text[:min(len(text), maxText)])
	id := errid.Capture(err)
	m.U8(uint8(len(id.Sentinels)))
	for _, n := range id.Sentinels {
		m.Str(n)
	}
	if id.HasStatus {
		m.U8(1).U32(uint32(id.Status))
	} else {
		m.U8(0)
	}
	if ce := id.Completion; ce != nil {
		m.U8(1).U64(ce.ID).U32(ce.QPN).U32(uint32(ce.Status))
	} else {
		m.U8(0)
	}
	return m
}

// getError reads what putError wrote. A body that ends after the text is
// a daemon of the first protocol: the code alone says what it matched.
// Unknown sentinel names (a newer daemon) are dropped; the text still says
// what happened.
func (m *Msg) getError(code uint8) error {
	text := m.GetStr()
	if m.off == len(m.b) || m.err != nil {
		return CodeError(code, text)
	}
	var id errid.Identity
	for range m.GetU8() {
		id.Sentinels = append(id.Sentinels, m.GetStr())
	}
	if m.GetU8() == 1 {
		id.HasStatus, id.Status = true, verbs.Status(m.GetU32())
	}
	if m.GetU8() == 1 {
		id.Completion = &verbs.CompletionError{ID: m.GetU64(), QPN: m.GetU32(), Status: verbs.Status(m.GetU32())}
	}
	if m.err != nil {
		return CodeError(code, text) // mangled identity: keep what the code says
	}
	return id.Err("krcored: "+text, ErrRemote)
}

// The outcome of a failed control SQE is the error, encoded as on the
// socket, in the header past the counters: u16 length, then the body. The
// daemon writes it before it publishes CtlDone, and writes it again only
// for the client's next control SQE, which the client sends after reading.
const (
	ctlErrOff = 1024
	ctlErrMax = headerLen - ctlErrOff - 2
)

// The error area lies past the counters.
var _ = [ctlErrOff - counters*lineLen]struct{}{}

// PutCtlErr writes the error of the control SQE the daemon is about to
// report in CtlDone (nothing for nil).
func (r *Ring) PutCtlErr(err error) {
	if err == nil {
		return
	}
	// The identity takes well under 1 KiB: the text gets the rest.
	b := (&Msg{}).putError(err, ctlErrMax-1024).b
	binary.LittleEndian.PutUint16(r.mem[ctlErrOff:], uint16(len(b)))
	copy(r.mem[ctlErrOff+2:], b)
}

// CtlErr is the error of the control SQE CtlDone reports with code (nil
// for CodeOK). The bytes are the daemon's; a length past the area reads as
// the code alone.
func (r *Ring) CtlErr(code uint8) error {
	if code == CodeOK {
		return nil
	}
	n := int(binary.LittleEndian.Uint16(r.mem[ctlErrOff:]))
	if n > ctlErrMax {
		return CodeError(code, "control request failed")
	}
	m := &Msg{b: append([]byte(nil), r.mem[ctlErrOff+2:ctlErrOff+2+n]...)}
	return m.getError(code)
}

// Sentinels lists the errors whose identity (errors.Is) crosses the
// socket and the ring; verbs.Status and *verbs.CompletionError cross too.
func Sentinels() []error { return errid.Sentinels() }
