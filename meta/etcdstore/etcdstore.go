package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/krcore/krcore/meta"
)

// Config says which etcd cluster holds the membership, and where in it.
type Config struct {
	// Endpoints are the etcd members' client URLs ("http://10.0.0.1:2379"
	// or "10.0.0.1:2379"); the client fails over between them.
	Endpoints []string
	// Prefix is the key prefix of this krcore cluster; default "/krcore/".
	// Clusters sharing an etcd use different prefixes.
	Prefix string
	// DialTimeout bounds connecting to an endpoint; default 2s.
	DialTimeout time.Duration
}

// Store is a meta.Membership kept in etcd. It is safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	prefix string
	eps    []string
	ctx    context.Context // ended by Close: stops every lease's keeper
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

var _ meta.Membership = (*Store)(nil)

// New connects to the etcd cluster of cfg (lazily: the first request
// dials).
func New(cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("etcdstore: no endpoints: %w", meta.ErrBadRecord)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/krcore/"
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: client for %v: %w", cfg.Endpoints, err)
	}
	s := &Store{cli: cli, prefix: cfg.Prefix, eps: cfg.Endpoints}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Close stops keeping leases alive and disconnects, without withdrawing
// anything: the records lapse with their leases, as when the process dies.
// Close each Lease first to withdraw its record at once.
func (s *Store) Close() error {
	err := meta.ErrClosed
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		err = s.cli.Close()
	})
	return err
}

// String implements meta.Membership: "etcd ENDPOINTS PREFIX".
func (s *Store) String() string { return "etcd " + strings.Join(s.eps, ",") + " " + s.prefix }

func (s *Store) nodeKey(node uint64) string { return fmt.Sprintf("%snodes/%020d", s.prefix, node) }
func (s *Store) nodesPrefix() string        { return s.prefix + "nodes/" }
func (s *Store) serversPrefix() string      { return s.prefix + "metaservers/" }

// Register implements meta.Membership: the record is stored at
// PREFIX/nodes/NODE (JSON) under an etcd lease of ttl rounded up to whole
// seconds, which the store keeps alive and, should it lapse (etcd
// unreachable for longer than ttl), takes out anew.
func (s *Store) Register(ctx context.Context, rec meta.Record, ttl time.Duration) (meta.Lease, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	rec.Version = 0
	val, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode record of node %d: %w", rec.Node, err)
	}
	key := s.nodeKey(rec.Node)
	put := func(ctx context.Context, id clientv3.LeaseID) error {
		return s.claim(ctx, key, string(val), rec, id)
	}
	return s.keep(ctx, fmt.Sprintf("register node %d", rec.Node), ttl, put)
}

// claim puts the record under lease id unless a live record of the node
// at another address holds the key.
func (s *Store) claim(ctx context.Context, key, val string, rec meta.Record, id clientv3.LeaseID) error {
	for {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return err
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(resp.Kvs) > 0 {
			var old meta.Record
			if json.Unmarshal(resp.Kvs[0].Value, &old) == nil && old.Addr != rec.Addr {
				return fmt.Errorf("etcdstore: register node %d at %s: held by %s: %w", rec.Node, rec.Addr, old.Addr, meta.ErrNodeInUse)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)
		}
		txn, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, val, clientv3.WithLease(id))).Commit()
		if err != nil || txn.Succeeded {
			return err
		}
		// The key changed between the Get and the Txn: look again.
	}
}

// Announce implements meta.Membership: the Info is stored at
// PREFIX/metaservers/LEASE under its own lease.
func (s *Store) Announce(ctx context.Context, info meta.Info, ttl time.Duration) (meta.Lease, error) {
	put := func(ctx context.Context, id clientv3.LeaseID) error {
		_, err := s.cli.Put(ctx, fmt.Sprintf("%s%016x", s.serversPrefix(), int64(id)), info.String(), clientv3.WithLease(id))
		return err
	}
	return s.keep(ctx, "announce MetaServer "+info.String(), ttl, put)
}

// Servers implements meta.Membership.
func (s *Store) Servers(ctx context.Context) ([]meta.Info, error) {
	resp, err := s.cli.Get(ctx, s.serversPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list MetaServers: %w", err)
	}
	infos := make([]meta.Info, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		info, err := meta.ParseInfo(string(kv.Value))
		if err != nil {
			return nil, fmt.Errorf("etcdstore: MetaServer at %s: %w", kv.Key, err)
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// Watch implements meta.Membership: a snapshot of PREFIX/nodes/, then
// the changes after its revision. It returns when ctx ends or the stream
// breaks (no leader, compaction, lost connection); the caller watches
// again, from a new snapshot.
func (s *Store) Watch(ctx context.Context, fn func(meta.Update)) error {
	resp, err := s.cli.Get(ctx, s.nodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("etcdstore: read records: %w", err)
	}
	snap := meta.Update{Reset: true, Put: make([]meta.Record, 0, len(resp.Kvs))}
	for _, kv := range resp.Kvs {
		if rec, ok := decode(kv.Value); ok {
			snap.Put = append(snap.Put, rec)
		}
	}
	fn(snap)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.cli.Watch(wctx, s.nodesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("etcdstore: watch records: %w", err)
		}
		fn(s.update(wr.Events))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("etcdstore: watch records: stream closed")
}

// update turns watch events into a meta.Update; undecodable values are
// skipped (a foreign writer under the prefix).
func (s *Store) update(evs []*clientv3.Event) meta.Update {
	var u meta.Update
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			if node, err := strconv.ParseUint(strings.TrimPrefix(string(ev.Kv.Key), s.nodesPrefix()), 10, 64); err == nil {
				u.Gone = append(u.Gone, node)
			}
			continue
		}
		if rec, ok := decode(ev.Kv.Value); ok {
			u.Put = append(u.Put, rec)
		}
	}
	return u
}

func decode(b []byte) (meta.Record, bool) {
	var rec meta.Record
	return rec, json.Unmarshal(b, &rec) == nil && rec.Validate() == nil
}

// ttlSeconds is ttl in etcd's whole seconds, rounded up, at least 1.
func ttlSeconds(ttl time.Duration) int64 { return max(1, int64((ttl+time.Second-1)/time.Second)) }

// keep grants a lease, puts under it, and starts the keeper that keeps it
// alive until the lease is closed or the store is.
func (s *Store) keep(ctx context.Context, what string, ttl time.Duration, put func(context.Context, clientv3.LeaseID) error) (meta.Lease, error) {
	if s.ctx.Err() != nil {
		return nil, fmt.Errorf("etcdstore: %s: %w", what, meta.ErrClosed)
	}
	id, err := s.grantPut(ctx, ttl, put)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %s: %w", what, err)
	}
	l := &lease{s: s, id: id, done: make(chan struct{})}
	kctx, cancel := context.WithCancel(s.ctx)
	l.cancel = cancel
	s.wg.Add(1)
	go l.run(kctx, ttl, put)
	return l, nil
}

// grantPut grants a lease of ttl and puts under it, revoking it if the put
// fails.
func (s *Store) grantPut(ctx context.Context, ttl time.Duration, put func(context.Context, clientv3.LeaseID) error) (clientv3.LeaseID, error) {
	g, err := s.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return 0, err
	}
	if err := put(ctx, g.ID); err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.cli.Revoke(rctx, g.ID)
		return 0, err
	}
	return g.ID, nil
}

// lease is a kept etcd lease; its keeper goroutine is run.
type lease struct {
	s      *Store
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	once   sync.Once

	mu sync.Mutex
	id clientv3.LeaseID // the current lease: run replaces a lapsed one
}

// run keeps the lease alive. The client's keep-alive survives lost
// connections by itself; its channel closes only when ctx ends or the
// lease is gone (it lapsed while etcd was out of reach), and then run
// takes out a new lease and puts again, retrying until it can.
func (l *lease) run(ctx context.Context, ttl time.Duration, put func(context.Context, clientv3.LeaseID) error) {
	defer l.s.wg.Done()
	defer close(l.done)
	pause := 10 * time.Millisecond
	for {
		l.mu.Lock()
		id := l.id
		l.mu.Unlock()
		if ch, err := l.s.cli.KeepAlive(ctx, id); err == nil {
			for range ch {
				pause = 10 * time.Millisecond
			}
		}
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
			nid, err := l.s.grantPut(ctx, ttl, put)
			if err == nil {
				l.mu.Lock()
				l.id = nid
				l.mu.Unlock()
				break
			}
			if errors.Is(err, meta.ErrNodeInUse) {
				return // another node took the id while this one was away
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// Close withdraws what the lease holds: it stops the keeper and revokes
// the lease, which deletes its keys.
func (l *lease) Close(ctx context.Context) error {
	err := meta.ErrClosed
	l.once.Do(func() {
		l.cancel()
		<-l.done
		l.mu.Lock()
		id := l.id
		l.mu.Unlock()
		if _, rerr := l.s.cli.Revoke(ctx, id); rerr != nil {
			err = fmt.Errorf("etcdstore: revoke lease %x: %w", int64(id), rerr)
		} else {
			err = nil
		}
	})
	return err
}
