package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Membership is a cluster's source of truth for node records when the
// MetaServers do not keep it themselves (ServerConfig.Membership): nodes
// Register their record in it under a lease they keep alive, MetaServers
// Watch it and mirror every record into their READ-able tables, and
// Announce themselves so that nodes and tools find them. Package etcdstore
// keeps it in etcd; MemMembership keeps it in one process.
type Membership interface {
	// Register publishes rec under a lease of at least ttl, kept alive by
	// the store until the Lease is closed, which withdraws the record. If
	// the process dies the lease lapses and the store drops the record. A
	// live record of the same node at another address is refused with
	// ErrNodeInUse.
	Register(ctx context.Context, rec Record, ttl time.Duration) (Lease, error)
	// Announce publishes a MetaServer's Info under a lease, as Register.
	Announce(ctx context.Context, info Info, ttl time.Duration) (Lease, error)
	// Servers lists the announced MetaServers.
	Servers(ctx context.Context) ([]Info, error)
	// Watch calls fn with the complete set of records (Update.Reset), then
	// with each change, until ctx ends or the store fails; after a broken
	// stream it may send a fresh complete set. fn runs on the caller's
	// goroutine and must not block for long.
	Watch(ctx context.Context, fn func(Update)) error
	// String names the store and where it lives, for operators.
	String() string
}

// Lease keeps a Register'ed record or Announce'd server alive.
type Lease interface {
	// Close withdraws the record and stops keeping it alive.
	Close(ctx context.Context) error
}

// Update is a change to the set of records in a Membership.
type Update struct {
	// Reset says Put is the whole set: every other record is gone.
	Reset bool
	// Put holds records added or changed (Version is ignored).
	Put []Record
	// Gone holds the ids of nodes whose record was withdrawn or lapsed.
	Gone []uint64
}

// MemMembership is a Membership in one process's memory: for in-process
// clusters with several MetaServers and for tests of the logic around a
// store. Its leases never lapse on their own; Expire stands for a lease
// that lapsed because its holder died.
type MemMembership struct {
	mu       sync.Mutex
	records  map[uint64]Record
	servers  map[uint64]Info
	nextID   uint64
	watchers map[uint64]chan struct{}
}

// NewMemMembership returns an empty in-memory store.
func NewMemMembership() *MemMembership {
	return &MemMembership{records: make(map[uint64]Record), servers: make(map[uint64]Info), watchers: make(map[uint64]chan struct{})}
}

// memLease is a MemMembership lease; close removes what it holds.
type memLease struct {
	once  sync.Once
	close func()
}

func (l *memLease) Close(context.Context) error {
	err := ErrClosed
	l.once.Do(func() { l.close(); err = nil })
	return err
}

// Register implements Membership.
func (m *MemMembership) Register(ctx context.Context, rec Record, ttl time.Duration) (Lease, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	rec = rec.content()
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.records[rec.Node]; ok && old.Addr != rec.Addr {
		return nil, fmt.Errorf("meta: register node %d at %s: held by %s: %w", rec.Node, rec.Addr, old.Addr, ErrNodeInUse)
	}
	m.records[rec.Node] = rec
	m.notifyLocked()
	return &memLease{close: func() { m.withdraw(rec) }}, nil
}

// withdraw removes rec if it is still the node's record.
func (m *MemMembership) withdraw(rec Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.records[rec.Node]; ok && cur == rec {
		delete(m.records, rec.Node)
		m.notifyLocked()
	}
}

// Expire drops node's record as a lapsed lease would.
func (m *MemMembership) Expire(node uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.records[node]; ok {
		delete(m.records, node)
		m.notifyLocked()
	}
}

// Announce implements Membership.
func (m *MemMembership) Announce(ctx context.Context, info Info, ttl time.Duration) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	id := m.nextID
	m.servers[id] = info
	return &memLease{close: func() {
		m.mu.Lock()
		delete(m.servers, id)
		m.mu.Unlock()
	}}, nil
}

// Servers implements Membership, in announcement order.
func (m *MemMembership) Servers(ctx context.Context) ([]Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]uint64, 0, len(m.servers))
	for id := range m.servers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	infos := make([]Info, len(ids))
	for i, id := range ids {
		infos[i] = m.servers[id]
	}
	return infos, nil
}

// Watch implements Membership. Updates queue per watcher, so a slow fn
// delays only its own watch.
func (m *MemMembership) Watch(ctx context.Context, fn func(Update)) error {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.nextID++
	id := m.nextID
	m.watchers[id] = ch
	snap := m.snapshotLocked()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.watchers, id)
		m.mu.Unlock()
	}()
	fn(snap)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
			// Coalesced: the latest full set stands for every change since.
			m.mu.Lock()
			snap = m.snapshotLocked()
			m.mu.Unlock()
			fn(snap)
		}
	}
}

// snapshotLocked is the whole set as a Reset update.
func (m *MemMembership) snapshotLocked() Update {
	u := Update{Reset: true, Put: make([]Record, 0, len(m.records))}
	for _, r := range m.records {
		u.Put = append(u.Put, r)
	}
	return u
}

// notifyLocked tells every watcher that the set changed. Watchers read
// the whole set again, so a full channel already carries the news.
func (m *MemMembership) notifyLocked() {
	for _, ch := range m.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// String implements Membership.
func (m *MemMembership) String() string { return "memory" }
