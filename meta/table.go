package meta

import "fmt"

// table is the record hash table inside the server's registered memory:
// buckets of slots, a node's record in one slot of bucket bucketOf(node).
// Only the server's loop goroutine writes it; clients read it with RDMA.
type table struct {
	mem     []byte
	buckets int
	slots   int
	owner   []uint64 // node held by each slot, 0 if free: placement without decoding
	version uint64   // the last version written, table-wide so versions never repeat
}

// tableBytes is the memory a table of the given geometry needs.
func tableBytes(buckets, slots int) int { return buckets * slots * SlotSize }

// newTable lays an empty table over mem, writing every slot as an intact
// empty slot so a client never sees a CRC mismatch in unused memory.
func newTable(mem []byte, buckets, slots int) (*table, error) {
	if buckets <= 0 || slots <= 0 || slots > MaxSlots {
		return nil, fmt.Errorf("meta: table of %d buckets x %d slots: need buckets > 0 and 1..%d slots: %w", buckets, slots, MaxSlots, ErrBadGeometry)
	}
	if len(mem) < tableBytes(buckets, slots) {
		return nil, fmt.Errorf("meta: table of %d buckets x %d slots needs %d bytes, have %d: %w", buckets, slots, tableBytes(buckets, slots), len(mem), ErrBadGeometry)
	}
	t := &table{mem: mem, buckets: buckets, slots: slots, owner: make([]uint64, buckets*slots)}
	for i := range t.owner {
		encodeSlot(t.slot(i), 0, Record{})
	}
	return t, nil
}

// slot is slot i's memory (i counts across buckets).
func (t *table) slot(i int) []byte { return t.mem[i*SlotSize : (i+1)*SlotSize] }

// find returns the slot holding node, or -1.
func (t *table) find(node uint64) int {
	first := bucketOf(node, t.buckets) * t.slots
	for i := first; i < first+t.slots; i++ {
		if t.owner[i] == node {
			return i
		}
	}
	return -1
}

// insert places a record for a node the table does not hold yet in the
// first free slot of its bucket.
func (t *table) insert(r Record) (slot int, version uint64, err error) {
	b := bucketOf(r.Node, t.buckets)
	for i := b * t.slots; i < (b+1)*t.slots; i++ {
		if t.owner[i] == 0 {
			t.owner[i] = r.Node
			return i, t.write(i, r), nil
		}
	}
	return -1, 0, fmt.Errorf("%w: node %d: bucket %d holds %d records", ErrTableFull, r.Node, b, t.slots)
}

// write stores r in slot i under a new version, in one copy of the encoded
// slot so the window in which a READ can tear is as short as it can be.
func (t *table) write(i int, r Record) uint64 {
	t.version++
	var b [SlotSize]byte
	encodeSlot(b[:], t.version, r)
	copy(t.slot(i), b[:])
	return t.version
}

// clear empties slot i under a new version: a client that reads it sees an
// intact empty slot, never the old record.
func (t *table) clear(i int) uint64 {
	t.owner[i] = 0
	return t.write(i, Record{})
}
