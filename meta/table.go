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

// Table sizes: a server's defaults and the bound on its buckets.
const (
	DefaultBuckets = 1024
	DefaultSlots   = 4
	// MaxBuckets bounds ServerConfig.Buckets: with MaxSlots slots it is a
	// 2 GiB table, room for millions of nodes; a larger number is more
	// likely a mistake than a cluster.
	MaxBuckets = 1 << 20
)

// CheckTable reports why a table of buckets x slots cannot be built (an
// error wrapping ErrBadGeometry), or nil. 0 stands for the default of
// either (DefaultBuckets, DefaultSlots).
func CheckTable(buckets, slots int) error {
	if buckets < 0 || buckets > MaxBuckets || slots < 0 || slots > MaxSlots {
		return fmt.Errorf("table of %d buckets x %d slots: want 1..%d buckets and 1..%d slots (0: the default, %d x %d): %w",
			buckets, slots, MaxBuckets, MaxSlots, DefaultBuckets, DefaultSlots, ErrBadGeometry)
	}
	return nil
}

// CheckEmbeddedTable is CheckTable for the MetaServer a runtime embeds
// when it lists no other (listed is how many it lists): a size given
// beside listed MetaServers has no server to take it.
func CheckEmbeddedTable(listed, buckets, slots int) error {
	if err := CheckTable(buckets, slots); err != nil {
		return err
	}
	if listed > 0 && (buckets != 0 || slots != 0) {
		return fmt.Errorf("a table of %d buckets x %d slots sizes the embedded MetaServer, but %d MetaServers are listed and none is embedded: %w",
			buckets, slots, listed, ErrBadGeometry)
	}
	return nil
}

// TableFor is a table for a cluster of up to nodes nodes: 8 slots (a
// 1 KiB READ) in the power of two of buckets at least 2*nodes (at most
// MaxBuckets). A bucket then holds a Poisson number of records of mean at
// most 1/2, so that one of nine (full: ErrTableFull) is a chance in 3e8
// per bucket; at a mean of 2 (nodes/2 buckets) a run of 3,000 nodes met one.
func TableFor(nodes int) (buckets, slots int) {
	buckets = 1
	for buckets < 2*nodes && buckets < MaxBuckets {
		buckets *= 2
	}
	return buckets, 8
}

// tableBytes is the memory a table of the given geometry needs.
func tableBytes(buckets, slots int) int { return buckets * slots * SlotSize }

// newTable lays an empty table over mem, writing every slot as an intact
// empty slot so a client never sees a CRC mismatch in unused memory.
func newTable(mem []byte, buckets, slots int) (*table, error) {
	if err := CheckTable(buckets, slots); err != nil || buckets == 0 || slots == 0 {
		return nil, fmt.Errorf("meta: table of %d buckets x %d slots: need 1..%d buckets and 1..%d slots: %w", buckets, slots, MaxBuckets, MaxSlots, ErrBadGeometry)
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
