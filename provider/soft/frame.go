package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/krcore/krcore/verbs"
)

// Frame types on a link.
const (
	frameRequest  = 1 // a request from a requester QP
	frameResponse = 2 // an ACK, NAK, READ response or atomic response
	frameHello    = 3 // first frame of a TCP link: version and node address
	frameHelloAck = 4 // the acceptor's answer to a hello
)

// Response syndromes, the soft fabric's ACK/NAK codes.
const (
	synAck       = 0 // success; payload is READ data or nothing
	synRNR       = 1 // receiver not ready: no receive posted
	synAccess    = 2 // key, bounds, access or PD violation
	synInvalid   = 3 // invalid request (misaligned atomic, opcode, too long)
	synRemoteOp  = 4 // the responder failed (bad receive SGE)
	synDCKey     = 5 // DC access key mismatch
	synNoDCT     = 6 // no such DC target
	numSyndromes = 7
)

// Request flags.
const (
	flagImm       = 1 << 0
	flagSolicited = 1 << 1
)

// headerLen is the fixed part of every frame after its 4-byte length.
const headerLen = 64

// maxPayload bounds any frame's payload: the largest RC message.
const maxPayload = 1 << 30

// protocolVersion is carried in hello frames; a peer speaking another
// version is refused.
const protocolVersion = 3

var errFrame = errors.New("soft: malformed frame")

// frame is one message on a link. Outbound payload is a list of segments
// pointing into registered memory (or inline copies), so neither wire copies
// it before the receiver does.
type frame struct {
	typ    uint8
	op     verbs.Opcode // request opcode
	syn    uint8        // response syndrome
	flags  uint8
	dstQPN uint32
	srcQPN uint32
	psn    uint32
	rkey   uint32 // request: rkey; UD: qkey
	raddr  uint64
	cmp    uint64 // CAS compare, FAA add; response: atomic original value
	swap   uint64
	imm    uint32
	rlen   uint32 // READ length, atomic length
	dckey  uint64
	gen    uint32   // requester incarnation: a DCT sequences each (node, DCI, gen); responses echo it
	segs   [][]byte // outbound payload
	plen   uint32   // payload length (decoded frames)
	held   []*mr    // MRs the outbound payload points into
	rd     segReader
}

func (f *frame) payloadLen() int {
	n := 0
	for _, s := range f.segs {
		n += len(s)
	}
	return n
}

// putHeader writes the 4-byte length and the fixed header into b, which
// must hold 4+headerLen bytes.
func (f *frame) putHeader(b []byte, plen int) {
	binary.BigEndian.PutUint32(b[0:], uint32(headerLen+plen))
	h := b[4:]
	h[0], h[1], h[2], h[3] = f.typ, byte(f.op), f.syn, f.flags
	binary.BigEndian.PutUint32(h[4:], f.dstQPN)
	binary.BigEndian.PutUint32(h[8:], f.srcQPN)
	binary.BigEndian.PutUint32(h[12:], f.psn)
	binary.BigEndian.PutUint32(h[16:], f.rkey)
	binary.BigEndian.PutUint64(h[20:], f.raddr)
	binary.BigEndian.PutUint64(h[28:], f.cmp)
	binary.BigEndian.PutUint64(h[36:], f.swap)
	binary.BigEndian.PutUint32(h[44:], f.imm)
	binary.BigEndian.PutUint32(h[48:], f.rlen)
	binary.BigEndian.PutUint64(h[52:], f.dckey)
	binary.BigEndian.PutUint32(h[60:], f.gen)
}

// decodeHeader parses the 4-byte length and fixed header in b and checks
// everything that can be checked without state. The payload (f.plen bytes)
// follows on the wire.
func decodeHeader(b []byte, f *frame) error {
	if len(b) < 4+headerLen {
		return fmt.Errorf("%w: %d header bytes, want %d", errFrame, len(b), 4+headerLen)
	}
	n := binary.BigEndian.Uint32(b)
	if n < headerLen || n-headerLen > maxPayload {
		return fmt.Errorf("%w: length %d", errFrame, n)
	}
	h := b[4:]
	*f = frame{
		typ: h[0], op: verbs.Opcode(h[1]), syn: h[2], flags: h[3],
		dstQPN: binary.BigEndian.Uint32(h[4:]),
		srcQPN: binary.BigEndian.Uint32(h[8:]),
		psn:    binary.BigEndian.Uint32(h[12:]),
		rkey:   binary.BigEndian.Uint32(h[16:]),
		raddr:  binary.BigEndian.Uint64(h[20:]),
		cmp:    binary.BigEndian.Uint64(h[28:]),
		swap:   binary.BigEndian.Uint64(h[36:]),
		imm:    binary.BigEndian.Uint32(h[44:]),
		rlen:   binary.BigEndian.Uint32(h[48:]),
		dckey:  binary.BigEndian.Uint64(h[52:]),
		gen:    binary.BigEndian.Uint32(h[60:]),
		plen:   n - headerLen,
	}
	switch f.typ {
	case frameRequest:
		if !f.op.Valid() {
			return fmt.Errorf("%w: request opcode %d", errFrame, f.op)
		}
		if f.op == verbs.OpRead || f.op.IsAtomic() {
			if f.plen != 0 {
				return fmt.Errorf("%w: %s carries %d payload bytes", errFrame, f.op, f.plen)
			}
		}
	case frameResponse:
		if f.syn >= numSyndromes {
			return fmt.Errorf("%w: syndrome %d", errFrame, f.syn)
		}
	case frameHello, frameHelloAck:
		if f.plen > 2+maxAddrLen {
			return fmt.Errorf("%w: hello of %d bytes", errFrame, f.plen)
		}
	default:
		return fmt.Errorf("%w: type %d", errFrame, f.typ)
	}
	return nil
}

// maxAddrLen bounds a node address in a hello.
const maxAddrLen = 255

// helloPayload is a hello's payload: version, then the sender's address.
func helloPayload(addr string) []byte {
	b := binary.BigEndian.AppendUint16(nil, protocolVersion)
	return append(b, addr...)
}

// parseHello checks a hello payload and returns the peer's address.
func parseHello(p []byte) (string, error) {
	if len(p) < 2 {
		return "", fmt.Errorf("%w: hello of %d bytes", errFrame, len(p))
	}
	if v := binary.BigEndian.Uint16(p); v != protocolVersion {
		return "", fmt.Errorf("soft: peer speaks protocol version %d, this node %d", v, protocolVersion)
	}
	return string(p[2:]), nil
}

// readFrame reads one whole frame whose payload is small (hellos) from r.
func readFrame(r io.Reader, hdr []byte, f *frame) ([]byte, error) {
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	if err := decodeHeader(hdr, f); err != nil {
		return nil, err
	}
	if f.plen > 2+maxAddrLen {
		return nil, fmt.Errorf("%w: unexpected payload of %d bytes", errFrame, f.plen)
	}
	p := make([]byte, f.plen)
	_, err := io.ReadFull(r, p)
	return p, err
}
