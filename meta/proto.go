package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore/verbs"
)

// op is a UD request's operation.
type op uint8

const (
	opHello      op = 1 // report the table geometry
	opRegister   op = 2 // store a record and start its lease
	opRenew      op = 3 // extend a record's lease
	opDeregister op = 4 // remove a record
	opConnect    op = 5 // connect an RC QP that may READ the table
	opReply      op = 0x80
)

func (o op) String() string {
	switch o {
	case opHello:
		return "hello"
	case opRegister:
		return "register"
	case opRenew:
		return "renew"
	case opDeregister:
		return "deregister"
	case opConnect:
		return "connect"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// status is a reply's outcome.
type status uint32

const (
	stOK        status = 0
	stNotFound  status = 1
	stTableFull status = 2
	stInvalid   status = 3
	stInUse     status = 4
)

// err maps a status to the error a client returns.
func (s status) err() error {
	switch s {
	case stOK:
		return nil
	case stNotFound:
		return ErrNotFound
	case stTableFull:
		return ErrTableFull
	case stInvalid:
		return fmt.Errorf("%w: refused by the server", ErrBadRecord)
	case stInUse:
		return ErrNodeInUse
	}
	return fmt.Errorf("meta: unknown reply status %d", uint32(s))
}

// Message framing. Integers are little-endian.
const (
	protoMagic   = 0x4d4b // "KM"
	protoVersion = 1

	reqHeaderLen = 64
	reqFixedLen  = reqHeaderLen + SlotSize
	// maxReplyAddr bounds the reply address a request carries (as
	// verbs.Endpoint bounds Addr).
	maxReplyAddr = 255
	maxRequest   = reqFixedLen + maxReplyAddr
	replyLen     = 96

	// grhLen is the Global Routing Header that starts every UD receive.
	grhLen = 40
)

var errMalformed = errors.New("meta: malformed message")

// request is a client's UD request. The reply goes to reply (address and
// QPN): a UD receive names the sender's QP but not its node.
type request struct {
	op    op
	id    uint64 // with node, makes retries idempotent
	node  uint64
	lease time.Duration
	reply verbs.Endpoint
	rec   Record // opRegister only
	// opConnect: the client's RC QP and its first PSN.
	rcQPN, rcPSN uint32
}

// encode appends the request's wire form to b.
func (r *request) encode(b []byte) []byte {
	le := binary.LittleEndian
	var h [reqFixedLen]byte
	le.PutUint16(h[0:], protoMagic)
	h[2] = protoVersion
	h[3] = byte(r.op)
	le.PutUint32(h[4:], r.reply.QPN)
	le.PutUint64(h[8:], r.id)
	le.PutUint64(h[16:], r.node)
	le.PutUint64(h[24:], uint64(r.lease))
	le.PutUint16(h[32:], r.reply.LID)
	h[34] = byte(len(r.reply.Addr))
	le.PutUint32(h[36:], r.rcQPN)
	le.PutUint32(h[40:], r.rcPSN)
	copy(h[48:64], r.reply.GID[:])
	encodeSlot(h[reqHeaderLen:], 0, r.rec)
	b = append(b, h[:]...)
	return append(b, r.reply.Addr...)
}

// decodeRequest parses a request. It checks framing only (lengths, magic,
// version, a usable reply address); whether the request makes sense is
// validate's job, so the server can answer a well-framed bad request.
func decodeRequest(b []byte) (request, error) {
	var r request
	if len(b) < reqFixedLen {
		return r, fmt.Errorf("%w: request of %d bytes, need %d", errMalformed, len(b), reqFixedLen)
	}
	le := binary.LittleEndian
	if le.Uint16(b[0:]) != protoMagic || b[2] != protoVersion {
		return r, fmt.Errorf("%w: magic %#x version %d", errMalformed, le.Uint16(b[0:]), b[2])
	}
	r.op = op(b[3])
	if r.op < opHello || r.op > opConnect {
		return r, fmt.Errorf("%w: unknown op %d", errMalformed, b[3])
	}
	n := int(b[34])
	if len(b) != reqFixedLen+n {
		return r, fmt.Errorf("%w: %d bytes with a reply address of %d", errMalformed, len(b), n)
	}
	r.reply = verbs.Endpoint{QPN: le.Uint32(b[4:]), LID: le.Uint16(b[32:]), Addr: string(b[reqFixedLen:])}
	copy(r.reply.GID[:], b[48:64])
	if n == 0 && r.reply.GID == (verbs.GID{}) && r.reply.LID == 0 {
		// A port is named by a fabric address (soft) or a GID or LID (RoCE, InfiniBand).
		return r, fmt.Errorf("%w: no reply address, GID or LID", errMalformed)
	}
	if r.reply.QPN == 0 {
		return r, fmt.Errorf("%w: reply QPN 0", errMalformed)
	}
	r.id = le.Uint64(b[8:])
	r.node = le.Uint64(b[16:])
	r.lease = time.Duration(le.Uint64(b[24:]))
	r.rcQPN, r.rcPSN = le.Uint32(b[36:]), le.Uint32(b[40:])
	if r.op == opRegister {
		rec, err := decodeSlot(b[reqHeaderLen:reqFixedLen])
		if err != nil {
			return r, fmt.Errorf("%w: record: %w", errMalformed, err)
		}
		r.rec = rec
	}
	return r, nil
}

// validate reports whether a well-framed request can be carried out.
func (r *request) validate() error {
	if r.op == opHello {
		return nil
	}
	if r.node == 0 {
		return fmt.Errorf("%w: node id 0", ErrBadRecord)
	}
	if r.lease < 0 {
		return fmt.Errorf("%w: negative lease", ErrBadRecord)
	}
	if r.op == opConnect && r.rcQPN == 0 {
		return fmt.Errorf("%w: connect without an RC QP", ErrBadRecord)
	}
	if r.op == opRegister {
		if r.rec.Node != r.node {
			return fmt.Errorf("%w: record of node %d in a request for node %d", ErrBadRecord, r.rec.Node, r.node)
		}
		return r.rec.Validate()
	}
	return nil
}

// geometry is what a client needs to read a server's table: the Hello
// reply.
type geometry struct {
	addr     uint64 // the table MR's first byte
	rkey     uint32
	buckets  uint32
	slots    uint32
	slotSize uint32
	dct      uint32
	dcKey    uint64
	epoch    uint64 // random per server start: a changed epoch means a restart
	maxLease time.Duration
}

// bucketBytes is the size of one bucket, the length of every lookup READ.
func (g *geometry) bucketBytes() int { return int(g.slots) * SlotSize }

// check reports whether this client can read a table of geometry g.
func (g *geometry) check() error {
	if g.slotSize != SlotSize || g.slots == 0 || g.slots > MaxSlots || g.buckets == 0 || g.rkey == 0 {
		return fmt.Errorf("%w: %d buckets x %d slots of %d bytes (client reads %d-byte slots, at most %d per bucket)",
			ErrBadGeometry, g.buckets, g.slots, g.slotSize, SlotSize, MaxSlots)
	}
	return nil
}

// reply is the server's answer to a request.
type reply struct {
	op      op // the request's op
	status  status
	id      uint64
	node    uint64
	version uint64        // the record's slot version (register, renew)
	lease   time.Duration // the lease granted (register, renew) or the default (hello)
	geo     geometry      // hello only
	// connect only, where hello has the table address: the server's RC QP
	// for the client's READs and its first PSN.
	qpn, psn uint32
}

// encode writes the reply's replyLen bytes into b.
func (r *reply) encode(b []byte) {
	b = b[:replyLen]
	clear(b)
	le := binary.LittleEndian
	le.PutUint16(b[0:], protoMagic)
	b[2] = protoVersion
	b[3] = byte(r.op | opReply)
	le.PutUint32(b[4:], uint32(r.status))
	le.PutUint64(b[8:], r.id)
	le.PutUint64(b[16:], r.node)
	le.PutUint64(b[24:], r.version)
	le.PutUint64(b[32:], uint64(r.lease))
	g := &r.geo
	if r.op == opConnect {
		le.PutUint32(b[40:], r.qpn)
		le.PutUint32(b[44:], r.psn)
		return
	}
	le.PutUint64(b[40:], g.addr)
	le.PutUint32(b[48:], g.rkey)
	le.PutUint32(b[52:], g.buckets)
	le.PutUint32(b[56:], g.slots)
	le.PutUint32(b[60:], g.slotSize)
	le.PutUint32(b[64:], g.dct)
	le.PutUint64(b[72:], g.dcKey)
	le.PutUint64(b[80:], g.epoch)
	le.PutUint64(b[88:], uint64(g.maxLease))
}

// decodeReply parses a reply.
func decodeReply(b []byte) (reply, error) {
	var r reply
	le := binary.LittleEndian
	if len(b) != replyLen || le.Uint16(b[0:]) != protoMagic || b[2] != protoVersion || op(b[3])&opReply == 0 {
		return r, fmt.Errorf("%w: reply of %d bytes", errMalformed, len(b))
	}
	r.op = op(b[3]) &^ opReply
	r.status = status(le.Uint32(b[4:]))
	r.id = le.Uint64(b[8:])
	r.node = le.Uint64(b[16:])
	r.version = le.Uint64(b[24:])
	r.lease = time.Duration(le.Uint64(b[32:]))
	if r.op == opConnect {
		r.qpn, r.psn = le.Uint32(b[40:]), le.Uint32(b[44:])
		return r, nil
	}
	r.geo = geometry{
		addr: le.Uint64(b[40:]), rkey: le.Uint32(b[48:]), buckets: le.Uint32(b[52:]),
		slots: le.Uint32(b[56:]), slotSize: le.Uint32(b[60:]), dct: le.Uint32(b[64:]),
		dcKey: le.Uint64(b[72:]), epoch: le.Uint64(b[80:]), maxLease: time.Duration(le.Uint64(b[88:])),
	}
	return r, nil
}
