package meta

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/krcore/krcore/verbs"
)

func sampleRecord(node uint64) Record {
	return Record{
		Node: node, Addr: "10.0.0.7:7471", GID: verbs.GID{0xfe, 0x80, 15: 7}, LID: 12,
		DCTNum: 0x1234, DCKey: 0xfeedbeefcafe0000 | node,
	}
}

func TestSlotRoundTrip(t *testing.T) {
	for _, r := range []Record{
		sampleRecord(1),
		{Node: ^uint64(0), Addr: strings.Repeat("a", MaxAddr), DCTNum: ^uint32(0), DCKey: ^uint64(0), LID: ^uint16(0)},
		{Node: 9, Addr: "mem:x"},
		{}, // the empty slot
	} {
		var b [SlotSize]byte
		encodeSlot(b[:], 77, r)
		got, err := decodeSlot(b[:])
		if err != nil {
			t.Fatalf("decode %+v: %v", r, err)
		}
		r.Version = 77
		if got != r {
			t.Fatalf("round trip: got %+v, want %+v", got, r)
		}
	}
}

// TestSlotTornDetected flips every byte of an encoded slot in turn, as a
// READ racing a write would mix bytes: every flip must fail the CRC.
func TestSlotTornDetected(t *testing.T) {
	var b [SlotSize]byte
	encodeSlot(b[:], 3, sampleRecord(42))
	for i := range b {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			c := b
			c[i] ^= mask
			if _, err := decodeSlot(c[:]); !errors.Is(err, errTorn) {
				t.Fatalf("byte %d ^ %#x: decode err %v, want errTorn", i, mask, err)
			}
		}
	}
}

// TestSlotTornMix builds every mix of an old and a new version of a slot
// that a READ copying in order could see: all but the pure ones are torn.
func TestSlotTornMix(t *testing.T) {
	var old, cur [SlotSize]byte
	encodeSlot(old[:], 5, sampleRecord(42))
	r := sampleRecord(42)
	r.DCTNum++
	encodeSlot(cur[:], 6, r)
	for cut := 1; cut < SlotSize; cut++ {
		var mix [SlotSize]byte
		copy(mix[:cut], cur[:cut])
		copy(mix[cut:], old[cut:])
		if mix == cur || mix == old {
			continue
		}
		if _, err := decodeSlot(mix[:]); !errors.Is(err, errTorn) {
			t.Fatalf("new[:%d]+old[%d:]: err %v, want errTorn", cut, cut, err)
		}
	}
}

func TestDecodeSlotRejectsBadLength(t *testing.T) {
	var b [SlotSize]byte
	encodeSlot(b[:], 1, sampleRecord(3))
	b[offAddrLen] = MaxAddr + 1
	// Re-seal, so the value is wrong but the CRC is not.
	binary.LittleEndian.PutUint32(b[offCRC:], crc32.Checksum(b[:offCRC], castagnoli))
	if _, err := decodeSlot(b[:]); !errors.Is(err, errBadSlot) {
		t.Fatalf("address length %d: err %v, want errBadSlot", MaxAddr+1, err)
	}
	if _, err := decodeSlot(b[:10]); !errors.Is(err, errBadSlot) {
		t.Fatalf("short slot: err %v, want errBadSlot", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		r  Record
		ok bool
	}{
		{sampleRecord(1), true},
		{Record{Node: 0, Addr: "x"}, false},
		{Record{Node: 1, Addr: strings.Repeat("x", MaxAddr+1)}, false},
		{Record{Node: 1, Addr: strings.Repeat("x", MaxAddr)}, true},
	}
	for _, c := range cases {
		err := c.r.Validate()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadRecord)) {
			t.Errorf("Validate(node %d, %d-byte addr) = %v, want ok=%v", c.r.Node, len(c.r.Addr), err, c.ok)
		}
	}
}

func TestScanBucket(t *testing.T) {
	bucket := make([]byte, 4*SlotSize)
	for i := range 4 {
		encodeSlot(bucket[i*SlotSize:], uint64(i+1), Record{})
	}
	if _, err := scanBucket(bucket, 7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("empty bucket: %v, want ErrNotFound", err)
	}
	encodeSlot(bucket[2*SlotSize:], 9, sampleRecord(7))
	got, err := scanBucket(bucket, 7)
	if err != nil || got.Node != 7 || got.Version != 9 {
		t.Fatalf("scan: %+v, %v", got, err)
	}
	// A torn slot of another node does not hide a found record...
	bucket[SlotSize+20] ^= 1
	if _, err := scanBucket(bucket, 7); err != nil {
		t.Fatalf("found record beside a torn slot: %v", err)
	}
	// ...but makes "not found" uncertain.
	if _, err := scanBucket(bucket, 8); !errors.Is(err, errTorn) {
		t.Fatalf("missing node beside a torn slot: %v, want errTorn", err)
	}
	// A torn slot whose node field matches is torn, not found.
	bucket[SlotSize+20] ^= 1
	bucket[2*SlotSize+40] ^= 1
	if _, err := scanBucket(bucket, 7); !errors.Is(err, errTorn) {
		t.Fatalf("torn matching slot: %v, want errTorn", err)
	}
}

func TestBucketOfSpreads(t *testing.T) {
	const n, buckets = 64 << 10, 1024
	counts := make([]int, buckets)
	for node := uint64(1); node <= n; node++ {
		b := bucketOf(node, buckets)
		if b < 0 || b >= buckets {
			t.Fatalf("bucketOf(%d) = %d", node, b)
		}
		counts[b]++
	}
	// Sequential ids, 64 per bucket on average: a good mixer stays well
	// within +-50%.
	for b, c := range counts {
		if c < 32 || c > 96 {
			t.Fatalf("bucket %d holds %d of %d sequential ids", b, c, n)
		}
	}
}

func TestTablePlacement(t *testing.T) {
	mem := make([]byte, tableBytes(8, 2))
	tbl, err := newTable(mem, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if r, err := decodeSlot(tbl.slot(i)); err != nil || r.Node != 0 {
			t.Fatalf("fresh slot %d: %+v %v", i, r, err)
		}
	}
	// Find three nodes of one bucket: two fit, the third fills it.
	var same []uint64
	for node := uint64(1); len(same) < 3; node++ {
		if bucketOf(node, 8) == 5 {
			same = append(same, node)
		}
	}
	var versions []uint64
	for _, node := range same[:2] {
		slot, ver, err := tbl.insert(sampleRecord(node))
		if err != nil || slot/2 != 5 || tbl.find(node) != slot {
			t.Fatalf("insert %d: slot %d, %v", node, slot, err)
		}
		versions = append(versions, ver)
	}
	if versions[1] <= versions[0] {
		t.Fatalf("versions %v do not grow", versions)
	}
	if _, _, err := tbl.insert(sampleRecord(same[2])); !errors.Is(err, ErrTableFull) {
		t.Fatalf("third record in a 2-slot bucket: %v, want ErrTableFull", err)
	}
	// The bytes are what a READ of the bucket would scan.
	bucket := mem[5*2*SlotSize : 6*2*SlotSize]
	if r, err := scanBucket(bucket, same[1]); err != nil || r != withVersion(sampleRecord(same[1]), versions[1]) {
		t.Fatalf("scan after insert: %+v %v", r, err)
	}
	// Clearing frees the slot under a new version; the node is gone.
	slot := tbl.find(same[0])
	cv := tbl.clear(slot)
	if r, err := decodeSlot(tbl.slot(slot)); err != nil || r.Node != 0 || r.Version != cv || cv <= versions[1] {
		t.Fatalf("cleared slot: %+v %v (clear version %d)", r, err, cv)
	}
	if _, err := scanBucket(bucket, same[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cleared node: %v", err)
	}
	if _, _, err := tbl.insert(sampleRecord(same[2])); err != nil || tbl.find(same[2]) != slot {
		t.Fatalf("reuse of a freed slot: %v", err)
	}
}

func TestNewTableBadGeometry(t *testing.T) {
	for _, g := range [][2]int{{0, 4}, {4, 0}, {4, MaxSlots + 1}} {
		if _, err := newTable(make([]byte, 1<<16), g[0], g[1]); !errors.Is(err, ErrBadGeometry) {
			t.Errorf("newTable(%d buckets, %d slots): %v", g[0], g[1], err)
		}
	}
	if _, err := newTable(make([]byte, 10), 4, 4); !errors.Is(err, ErrBadGeometry) {
		t.Errorf("newTable in too little memory: %v", err)
	}
}

func withVersion(r Record, v uint64) Record {
	r.Version = v
	return r
}
