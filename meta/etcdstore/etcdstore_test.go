package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/meta/etcdstore"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// member is one running etcd member.
type member struct {
	e      *embed.Etcd
	client string // client URL
	once   sync.Once
}

// stop closes the member (once: Cleanup closes it too).
func (m *member) stop() { m.once.Do(m.e.Close) }

// kill stops the member as a crash would: no leadership transfer.
func (m *member) kill() {
	m.once.Do(func() {
		m.e.Server.HardStop()
		m.e.Close()
	})
}

func (m *member) leader() bool { return m.e.Server.Leader() == m.e.Server.MemberID() }

// freeURLs are n loopback URLs on distinct ports that were free a moment
// ago: every listener stays open until all are picked, so that the kernel
// cannot hand out one port twice (a port closed at once can come back at
// the next pick, and etcd refuses a cluster with a duplicate URL).
func freeURLs(t *testing.T, n int) []url.URL {
	t.Helper()
	urls := make([]url.URL, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		urls[i] = url.URL{Scheme: "http", Host: l.Addr().String()}
	}
	return urls
}

// startEtcd starts an n-member etcd cluster on loopback (random ports,
// temporary directories), each member stopped by t.Cleanup. Ticks are
// short so that a lost leader is replaced within a second.
func startEtcd(t *testing.T, n int) []*member {
	t.Helper()
	urls := freeURLs(t, 2*n)
	peers, clients, initial := urls[:n], urls[n:], make([]string, n)
	for i := range n {
		initial[i] = fmt.Sprintf("m%d=%s", i, peers[i].String())
	}
	ms := make([]*member, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name, cfg.Dir = fmt.Sprintf("m%d", i), t.TempDir()
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peers[i]}, []url.URL{peers[i]}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clients[i]}, []url.URL{clients[i]}
		cfg.InitialCluster, cfg.InitialClusterToken = strings.Join(initial, ","), "krcore-test"
		cfg.TickMs, cfg.ElectionMs = 50, 500
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		wg.Add(1)
		go func() { // members of a new cluster wait for each other: start them together
			defer wg.Done()
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				errs[i] = err
				return
			}
			ms[i] = &member{e: e, client: clients[i].String()}
			select {
			case <-e.Server.ReadyNotify():
			case <-time.After(20 * time.Second):
				errs[i] = fmt.Errorf("etcd member %d not ready", i)
			}
		}()
	}
	wg.Wait()
	for _, m := range ms {
		if m != nil {
			t.Cleanup(m.stop)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return ms
}

// leaderOf waits until one of ms leads and returns it.
func leaderOf(ms []*member) *member {
	for {
		for _, m := range ms {
			if m.leader() {
				return m
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func endpoints(ms []*member) []string {
	eps := make([]string, len(ms))
	for i, m := range ms {
		eps[i] = m.client
	}
	return eps
}

func newStore(t *testing.T, eps []string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(etcdstore.Config{Endpoints: eps, Prefix: "/test/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// devices starts n soft RNICs on one in-memory fabric.
func devices(t *testing.T, n int) []*soft.Node {
	t.Helper()
	fab := soft.NewFabric()
	ds := make([]*soft.Node, n)
	for i := range ds {
		d, err := fab.NewNode(soft.Config{RetryTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		ds[i] = d
	}
	return ds
}

func startServer(t *testing.T, dev verbs.Device, m meta.Membership) *meta.Server {
	t.Helper()
	s, err := meta.NewServer(dev, meta.ServerConfig{Membership: m, Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func startClient(t *testing.T, dev verbs.Device, infos ...meta.Info) *meta.Client {
	t.Helper()
	c, err := meta.NewClient(dev, infos, meta.ClientConfig{ReadTimeout: 200 * time.Millisecond, RequestTimeout: 20 * time.Millisecond, Attempts: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// record is a plausible record of node on dev.
func record(dev verbs.Device, node uint64) meta.Record {
	return meta.NewRecord(node, dev.Port(), uint32(0x100+node), 0xdc00+node)
}

// waitFetch polls c (every 10ms) until its Fetch of node finds a record
// (found) or ErrNotFound (!found), and says how long it took.
func waitFetch(t *testing.T, c *meta.Client, node uint64, found bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Fetch(ctx, node)
		cancel()
		if (found && err == nil) || (!found && errors.Is(err, meta.ErrNotFound)) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("node %d found=%v: not within %v (last: %v)", node, found, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// register retries a Register until it succeeds, as a joining node does
// while etcd elects a leader.
func register(t *testing.T, s *etcdstore.Store, rec meta.Record, ttl time.Duration) meta.Lease {
	t.Helper()
	ctx := testCtx(t, 15*time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		l, err := s.Register(rctx, rec, ttl)
		cancel()
		if err == nil {
			return l
		}
		if ctx.Err() != nil || errors.Is(err, meta.ErrNodeInUse) {
			t.Fatalf("register node %d: %v", rec.Node, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEmbeddedEtcd: on one embedded etcd member, two MetaServers mirror
// the records nodes register; a withdrawn record goes at once, a node
// whose lease lapses (its process died: its store closed without
// revoking) goes from both tables, a restarted MetaServer rebuilds its
// table from etcd, and both MetaServers are listed.
func TestEmbeddedEtcd(t *testing.T) {
	eps := endpoints(startEtcd(t, 1))
	devs := devices(t, 4)
	ctx := testCtx(t, 60*time.Second)
	srvStore := newStore(t, eps)
	a, b := startServer(t, devs[0], srvStore), startServer(t, devs[1], srvStore)
	c := startClient(t, devs[3], a.Info(), b.Info())
	cb := startClient(t, devs[3], b.Info())

	// Nodes 1 and 2 must not lapse (node 1 is withdrawn, node 2 stays to
	// the end): a 1 s lease lapsed under -race on a loaded machine when
	// the keeper's renewals stalled, and node 2 left the tables.
	nodeStore := newStore(t, eps)
	l1 := register(t, nodeStore, record(devs[2], 1), 10*time.Second)
	register(t, nodeStore, record(devs[2], 2), 10*time.Second)
	for _, cl := range []*meta.Client{c, cb} {
		waitFetch(t, cl, 1, true, 5*time.Second)
		waitFetch(t, cl, 2, true, 5*time.Second)
	}
	got, err := cb.Fetch(ctx, 1)
	if err != nil || got.Node != 1 || got.DCTNum != 0x101 || got.Addr != devs[2].Port().Addr {
		t.Fatalf("mirrored record %+v, %v", got, err)
	}
	if _, err := nodeStore.Register(ctx, record(devs[3], 1), time.Second); !errors.Is(err, meta.ErrNodeInUse) {
		t.Fatalf("node 1 from another address: %v, want ErrNodeInUse", err)
	}
	var infos []meta.Info
	for range 100 {
		if infos, err = srvStore.Servers(ctx); err == nil && len(infos) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(infos) != 2 || !strings.HasPrefix(a.Source(), "etcd ") {
		t.Fatalf("servers %v (%v), source %q: want both MetaServers announced, state from etcd", infos, err, a.Source())
	}

	if err := l1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFetch(t, c, 1, false, 5*time.Second)

	// A MetaServer restart rebuilds from etcd.
	a.Close()
	a2 := startServer(t, devs[0], srvStore)
	waitFetch(t, startClient(t, devs[3], a2.Info()), 2, true, 5*time.Second)

	// Node 3 dies: its store stops keeping its lease, which lapses.
	dying := newStore(t, eps)
	register(t, dying, record(devs[2], 3), time.Second)
	waitFetch(t, cb, 3, true, 5*time.Second)
	dying.Close()
	gone := waitFetch(t, cb, 3, false, 10*time.Second)
	t.Logf("a dead node's record left the tables %v after its keeper stopped (lease 1s)", gone.Round(time.Millisecond))
	if st := b.Stats(); st.Records != 1 || st.Updates == 0 {
		t.Fatalf("server b %+v: want node 2 alone", st)
	}
}

// TestEtcdFailover runs two MetaServers on a three-member etcd cluster
// while a client connects to nodes without end (a Fetch past its cache,
// retried on error) and uses its cached peers (Lookup). The etcd leader is
// killed, then a MetaServer: no connect that retries is lost, no cached
// lookup fails, and nodes that join after each kill become reachable.
func TestEtcdFailover(t *testing.T) {
	ms := startEtcd(t, 3)
	eps := endpoints(ms)
	devs := devices(t, 4)
	a, b := startServer(t, devs[0], newStore(t, eps)), startServer(t, devs[1], newStore(t, eps))
	c := startClient(t, devs[3], a.Info(), b.Info())
	nodeStore := newStore(t, eps)
	const cached, connected = 4, 16
	for n := uint64(1); n <= cached+connected; n++ {
		register(t, nodeStore, record(devs[2], n), 2*time.Second)
	}
	for n := uint64(1); n <= cached+connected; n++ {
		waitFetch(t, c, n, true, 5*time.Second)
	}

	var stop atomic.Bool
	var connects, retried, lost, lookups, lookupErrs atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			for n := uint64(1); n <= cached; n++ {
				lookups.Add(1)
				if _, err := c.Lookup(context.Background(), n); err != nil {
					lookupErrs.Add(1)
				}
			}
			node := uint64(cached + 1 + rand.IntN(connected))
			c.Invalidate(node) // a connect to a peer not in the cache
			connects.Add(1)
			if !connectRetrying(c, node, 5*time.Second, &retried) {
				lost.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)

	killed := time.Now()
	leaderOf(ms).kill()
	register(t, nodeStore, record(devs[2], 100), 2*time.Second)
	waitFetch(t, c, 100, true, 10*time.Second)
	t.Logf("a node joining as the etcd leader died was reachable %v after the kill (MetaServer watches: a %d, b %d)",
		time.Since(killed).Round(time.Millisecond), a.Stats().Watches, b.Stats().Watches)

	a.Close()
	register(t, nodeStore, record(devs[2], 101), 2*time.Second)
	waitFetch(t, c, 101, true, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	<-done
	t.Logf("%d connects (%d needed a retry), %d lost; %d cached lookups, %d failed; server b watched %d times",
		connects.Load(), retried.Load(), lost.Load(), lookups.Load(), lookupErrs.Load(), b.Stats().Watches)
	if lost.Load() != 0 || lookupErrs.Load() != 0 || connects.Load() < 10 {
		t.Fatalf("%d of %d connects lost, %d of %d cached lookups failed", lost.Load(), connects.Load(), lookupErrs.Load(), lookups.Load())
	}
}

// connectRetrying fetches node until it answers or within passes.
func connectRetrying(c *meta.Client, node uint64, within time.Duration, retried *atomic.Int64) bool {
	deadline := time.Now().Add(within)
	for first := true; time.Now().Before(deadline); first = false {
		if !first {
			retried.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Fetch(ctx, node)
		cancel()
		if err == nil {
			return true
		}
	}
	return false
}
