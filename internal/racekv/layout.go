package racekv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
)

// Sizes of the table's parts, in bytes.
const (
	SlotSize     = 8
	BucketSlots  = 8
	BucketSize   = SlotSize * BucketSlots
	GroupSize    = 3 * BucketSize // main A, overflow, main B
	CombinedSize = 2 * BucketSize // what one lookup READ fetches
	HeaderSize   = 64
	BlockUnit    = 64 // a key-value block's size is a multiple of this
	blockHeader  = 4  // key length, value length (2 bytes each)
	// MaxBlock is the largest key-value block a slot can name.
	MaxBlock = 255 * BlockUnit
	// Magic opens every memory node's region.
	Magic = 0x3176_6b65_6361_72 // "racekv1" little-endian
)

// Header words (8 bytes each, host order as RDMA atomics use them).
const (
	hMagic = iota
	hSubtables
	hGroups
	hNodes
	hIndex
	hHeapStart
	hHeapTop // FETCH_ADDed by clients to take heap chunks
	hHeapEnd
)

// words is the byte order of slots and header words: the host's, which is
// the order an RNIC's CAS and FETCH_ADD read and write 8-byte words in.
var words = binary.NativeEndian

// Sentinel errors.
var (
	// ErrFull: a key's two combined buckets have no empty slot, or a
	// memory node's heap is used up.
	ErrFull = errors.New("racekv: table full")
	// ErrFormat: a region does not hold a table this package formatted.
	ErrFormat = errors.New("racekv: not a racekv table")
	// ErrTooLarge: a key or value does not fit a block.
	ErrTooLarge = errors.New("racekv: key or value too large")
	// ErrContention: a Put lost its CAS too many times in a row.
	ErrContention = errors.New("racekv: too many lost CAS")
)

// Geometry is a table's shape across its memory nodes.
type Geometry struct {
	// Nodes is the number of memory nodes; Subtables a multiple of it.
	Nodes, Subtables int
	// Groups is the number of bucket groups per subtable.
	Groups int
	// Heap is each node's space for key-value blocks, in bytes.
	Heap int
}

// ForKeys is a geometry holding keys keys with slots to spare (at most
// half of the slots full), across nodes memory nodes, each with heap
// bytes for blocks.
func ForKeys(keys, nodes, heap int) Geometry {
	subtables := 8 * nodes
	slots := 2 * keys
	groups := max((slots+subtables*3*BucketSlots-1)/(subtables*3*BucketSlots), 1)
	return Geometry{Nodes: nodes, Subtables: subtables, Groups: groups, Heap: heap}
}

// check says what is wrong with g.
func (g Geometry) check() error {
	if g.Nodes < 1 || g.Subtables < g.Nodes || g.Subtables%g.Nodes != 0 || g.Groups < 1 || g.Heap < 0 {
		return fmt.Errorf("racekv: geometry %+v: want nodes >= 1, subtables a multiple of nodes, groups >= 1: %w", g, ErrFormat)
	}
	return nil
}

// tableBytes is the size of one node's subtables.
func (g Geometry) tableBytes() int { return g.Subtables / g.Nodes * g.Groups * GroupSize }

// RegionSize is the size of each memory node's region.
func (g Geometry) RegionSize() int { return HeaderSize + g.tableBytes() + g.Heap }

// Format writes an empty table into mem, the region of memory node index
// (0-based) of a table of geometry g; mem must be g.RegionSize() bytes.
func Format(mem []byte, g Geometry, index int) error {
	if err := g.check(); err != nil {
		return err
	}
	if len(mem) != g.RegionSize() || index < 0 || index >= g.Nodes {
		return fmt.Errorf("racekv: format %d B as node %d of %+v (region %d B): %w", len(mem), index, g, g.RegionSize(), ErrFormat)
	}
	clear(mem)
	start := uint64(HeaderSize + g.tableBytes())
	for i, v := range []uint64{Magic, uint64(g.Subtables), uint64(g.Groups), uint64(g.Nodes), uint64(index), start, start, uint64(len(mem))} {
		words.PutUint64(mem[i*8:], v)
	}
	return nil
}

// parseHeader reads a region's header into its geometry and heap end.
func parseHeader(h []byte) (Geometry, uint64, error) {
	w := func(i int) uint64 { return words.Uint64(h[i*8:]) }
	if w(hMagic) != Magic {
		return Geometry{}, 0, fmt.Errorf("racekv: header magic %#x: %w", w(hMagic), ErrFormat)
	}
	g := Geometry{Nodes: int(w(hNodes)), Subtables: int(w(hSubtables)), Groups: int(w(hGroups))}
	if err := g.check(); err != nil {
		return Geometry{}, 0, err
	}
	g.Heap = int(w(hHeapEnd) - w(hHeapStart))
	return g, w(hHeapEnd), nil
}

// slot is a slot's value: fingerprint, block length in units, offset.
type slot uint64

func makeSlot(fp byte, units int, off uint64) slot {
	return slot(uint64(fp)<<56 | uint64(units)<<48 | off&(1<<48-1))
}

func (s slot) fp() byte      { return byte(s >> 56) }
func (s slot) size() int     { return int(s>>48&0xff) * BlockUnit }
func (s slot) off() uint64   { return uint64(s) & (1<<48 - 1) }
func (s slot) isEmpty() bool { return s.off() == 0 }

// place is where a key may live: its subtable and two combined buckets
// (offsets in the subtable's node's region), and its fingerprint.
type place struct {
	node    int
	buckets [2]uint64
	fp      byte
}

// mix is splitmix64's finalizer: it spreads one hash into independent
// looking ones.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// placeOf hashes key into g.
func placeOf(g Geometry, key []byte) place {
	f := fnv.New64a()
	f.Write(key)
	h := f.Sum64()
	sub := int(mix(h^0x5851f42d4c957f2d) % uint64(g.Subtables))
	base := uint64(HeaderSize + sub/g.Nodes*g.Groups*GroupSize)
	p := place{node: sub % g.Nodes, fp: byte(mix(h ^ 0x2545f4914f6cdd1d))}
	for i, salt := range []uint64{0x9e3779b97f4a7c15, 0xc2b2ae3d27d4eb4f} {
		m := mix(h ^ salt)
		group, side := m%uint64(g.Groups), m>>63
		p.buckets[i] = base + group*GroupSize + side*BucketSize
	}
	return p
}

// blockSize is the size of the block holding key and val.
func blockSize(key, val []byte) int {
	n := blockHeader + len(key) + len(val)
	return (n + BlockUnit - 1) / BlockUnit * BlockUnit
}

// encodeBlock lays key and val out as a block in b (blockSize bytes).
func encodeBlock(b, key, val []byte) {
	binary.LittleEndian.PutUint16(b, uint16(len(key)))
	binary.LittleEndian.PutUint16(b[2:], uint16(len(val)))
	n := copy(b[blockHeader:], key)
	n += copy(b[blockHeader+n:], val)
	clear(b[blockHeader+n:])
}

// decodeBlock returns a block's key and value, or false if it is not a
// well-formed block.
func decodeBlock(b []byte) (key, val []byte, ok bool) {
	if len(b) < blockHeader {
		return nil, nil, false
	}
	kl, vl := int(binary.LittleEndian.Uint16(b)), int(binary.LittleEndian.Uint16(b[2:]))
	if blockHeader+kl+vl > len(b) {
		return nil, nil, false
	}
	return b[blockHeader : blockHeader+kl], b[blockHeader+kl : blockHeader+kl+vl], true
}
