package meta

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"

	"github.com/krcore/krcore/verbs"
)

// SlotSize is the size of one record slot in the table, in bytes. It is
// fixed so a client can compute any slot's address from the geometry alone.
const SlotSize = 128

// MaxAddr is the longest fabric address a Record can hold, in bytes.
const MaxAddr = 47

// MaxSlots bounds the slots per bucket, so one READ of a bucket stays small
// (MaxSlots*SlotSize bytes) and a client's landing buffers have a fixed size.
const MaxSlots = 16

// Slot field offsets; see the package documentation for the table.
const (
	offVersion = 0
	offNode    = 8
	offDCKey   = 16
	offDCT     = 24
	offLID     = 28
	offAddrLen = 30
	offGID     = 32
	offAddr    = 48
	offCtrlQPN = 96
	offCtrlQKy = 100
	offCRC     = SlotSize - 4
)

// castagnoli is the CRC32-C table; amd64 and arm64 compute it in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record is one node's DC target metadata: everything a peer needs to reach
// the node's DCT from any DCI without a handshake.
type Record struct {
	// Node is the node's cluster-wide id; 0 is reserved for "empty".
	Node uint64
	// Addr is the node's fabric address (verbs.PortAttr.Addr), at most
	// MaxAddr bytes.
	Addr string
	// GID and LID address the node on fabrics that route by them
	// (InfiniBand, RoCE); zero on the soft fabric.
	GID verbs.GID
	LID uint16
	// DCTNum is the number of the node's DC target; 0 when the node has
	// none (a device without DC: peers reach it over RC).
	DCTNum uint32
	// DCKey is the DC access key the target checks on every request.
	DCKey uint64
	// CtrlQPN and CtrlQKey name the node's control UD QP, through which
	// peers set up RC connections to it and look up its regions; 0 if it
	// has none.
	CtrlQPN, CtrlQKey uint32
	// Version is assigned by the MetaServer: it grows each time the slot
	// holding the record is written with new content, so a client can tell
	// a refetched record from the one it cached. Register ignores it.
	Version uint64
}

// NewRecord builds the record of a node whose DCT dct (keyed dcKey) lives
// on the device whose port is port.
func NewRecord(node uint64, port verbs.PortAttr, dctNum uint32, dcKey uint64) Record {
	return Record{Node: node, Addr: port.Addr, GID: port.GID, LID: port.LID, DCTNum: dctNum, DCKey: dcKey}
}

// Endpoint is the address an AH for the record's node needs, with QPN set
// to the DCT number (the RemoteQPN of DCI sends).
func (r Record) Endpoint() verbs.Endpoint {
	return verbs.Endpoint{Addr: r.Addr, GID: r.GID, LID: r.LID, QPN: r.DCTNum}
}

// Validate reports why r cannot be registered, or nil.
func (r Record) Validate() error {
	switch {
	case r.Node == 0:
		return fmt.Errorf("%w: node id 0 is reserved", ErrBadRecord)
	case len(r.Addr) > MaxAddr:
		return fmt.Errorf("%w: node %d: address of %d bytes, max %d", ErrBadRecord, r.Node, len(r.Addr), MaxAddr)
	}
	return nil
}

// content is r without the server-assigned version, for comparing what a
// client asked to store.
func (r Record) content() Record {
	r.Version = 0
	return r
}

// encodeSlot writes r with version into the SlotSize bytes of b, ending
// with the CRC that makes a torn copy detectable. r must be valid or empty
// (Node 0).
func encodeSlot(b []byte, version uint64, r Record) {
	b = b[:SlotSize]
	clear(b)
	le := binary.LittleEndian
	le.PutUint64(b[offVersion:], version)
	le.PutUint64(b[offNode:], r.Node)
	le.PutUint64(b[offDCKey:], r.DCKey)
	le.PutUint32(b[offDCT:], r.DCTNum)
	le.PutUint16(b[offLID:], r.LID)
	b[offAddrLen] = byte(copy(b[offAddr:offAddr+MaxAddr], r.Addr))
	le.PutUint32(b[offCtrlQPN:], r.CtrlQPN)
	le.PutUint32(b[offCtrlQKy:], r.CtrlQKey)
	copy(b[offGID:], r.GID[:])
	le.PutUint32(b[offCRC:], crc32.Checksum(b[:offCRC], castagnoli))
}

// slotIntact reports whether the slot's CRC matches its content: false for
// a READ that copied parts of two versions.
func slotIntact(b []byte) bool {
	return crc32.Checksum(b[:offCRC], castagnoli) == binary.LittleEndian.Uint32(b[offCRC:])
}

// slotNode is the node field of a slot, unverified.
func slotNode(b []byte) uint64 { return binary.LittleEndian.Uint64(b[offNode:]) }

// decodeSlot decodes a slot. It fails with errTorn when the CRC does not
// match and errBadSlot when an intact slot holds an impossible value; an
// empty slot decodes to a Record with Node 0.
func decodeSlot(b []byte) (Record, error) {
	if len(b) < SlotSize {
		return Record{}, fmt.Errorf("%w: %d bytes, want %d", errBadSlot, len(b), SlotSize)
	}
	if !slotIntact(b) {
		return Record{}, errTorn
	}
	le := binary.LittleEndian
	n := int(b[offAddrLen])
	if n > MaxAddr {
		return Record{}, fmt.Errorf("%w: address length %d", errBadSlot, n)
	}
	r := Record{
		Version: le.Uint64(b[offVersion:]),
		Node:    le.Uint64(b[offNode:]),
		DCKey:   le.Uint64(b[offDCKey:]),
		DCTNum:  le.Uint32(b[offDCT:]),
		LID:     le.Uint16(b[offLID:]),
		Addr:    string(b[offAddr : offAddr+n]),
		CtrlQPN: le.Uint32(b[offCtrlQPN:]), CtrlQKey: le.Uint32(b[offCtrlQKy:]),
	}
	copy(r.GID[:], b[offGID:])
	return r, nil
}

// scanBucket finds node in a bucket of slots as one READ returned it. It
// returns ErrNotFound only when every slot was intact: a torn slot might
// have been node's, so the caller must read again (errTorn).
func scanBucket(bucket []byte, node uint64) (Record, error) {
	for off := 0; off+SlotSize <= len(bucket); off += SlotSize {
		s := bucket[off : off+SlotSize]
		if slotNode(s) != node {
			continue
		}
		r, err := decodeSlot(s)
		if err == nil && r.Node == node {
			return r, nil
		}
		return Record{}, errTorn // the node field matched but the slot is not intact
	}
	for off := 0; off+SlotSize <= len(bucket); off += SlotSize {
		if !slotIntact(bucket[off : off+SlotSize]) {
			return Record{}, errTorn
		}
	}
	return Record{}, ErrNotFound
}

// mix64 is splitmix64's finalizer: every input bit affects every output
// bit, so sequential node ids spread over all buckets.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// bucketOf is node's bucket among n: the high word of mix64(node)*n, which
// is uniform without a division.
func bucketOf(node uint64, n int) int {
	hi, _ := bits.Mul64(mix64(node), uint64(n))
	return int(hi)
}
