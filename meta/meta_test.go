package meta

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLookup: register, look up (cached and not), deregister, on both the
// in-memory and the TCP wire, with the registering node and another node
// reading.
func TestLookup(t *testing.T) {
	for name, mk := range fabrics {
		t.Run(name, func(t *testing.T) {
			nodes := mk(t, 3)
			ctx := testCtx(t)
			srv := startServer(t, nodes[0], ServerConfig{})
			owner := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
			reader := startClient(t, nodes[2], []Info{srv.Info()}, fastClient)

			rec := recordOf(nodes[1], 7)
			if err := owner.Register(ctx, rec, 0); err != nil {
				t.Fatal(err)
			}
			got, err := reader.Lookup(ctx, 7)
			if err != nil {
				t.Fatal(err)
			}
			if got.Version == 0 || withVersion(got, 0) != rec {
				t.Fatalf("Lookup = %+v, want %+v with a version", got, rec)
			}
			if again, err := reader.Lookup(ctx, 7); err != nil || again != got {
				t.Fatalf("cached Lookup = %+v, %v", again, err)
			}
			if _, err := reader.Fetch(ctx, 7); err != nil {
				t.Fatal(err)
			}
			st := reader.Stats()
			if st.Hits != 1 || st.Misses != 1 || st.Reads != 2 {
				t.Fatalf("stats %+v: want 1 hit, 1 miss, 2 READs (one per fetch)", st)
			}
			if _, err := reader.Lookup(ctx, 8); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Lookup of an unregistered node: %v", err)
			}
			if err := owner.Deregister(ctx, 7); err != nil {
				t.Fatal(err)
			}
			if _, err := reader.Fetch(ctx, 7); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Fetch after Deregister: %v", err)
			}
			if _, err := reader.Lookup(ctx, 7); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Lookup after a Fetch found nothing must not hit the cache: %v", err)
			}
			if err := owner.Deregister(ctx, 7); err != nil {
				t.Fatalf("second Deregister: %v", err)
			}
			if n := srv.Stats().Records; n != 0 {
				t.Fatalf("server holds %d records", n)
			}
		})
	}
}

// TestLoopback: server and client on one device, as a runtime embedding
// its own MetaServer runs them.
func TestLoopback(t *testing.T) {
	for name, mk := range fabrics {
		t.Run(name, func(t *testing.T) {
			dev := mk(t, 1)[0]
			ctx := testCtx(t)
			srv := startServer(t, dev, ServerConfig{})
			c := startClient(t, dev, []Info{srv.Info()}, fastClient)
			if err := c.Register(ctx, recordOf(dev, 1), time.Second); err != nil {
				t.Fatal(err)
			}
			if r, err := c.Lookup(ctx, 1); err != nil || r.Node != 1 {
				t.Fatalf("Lookup = %+v, %v", r, err)
			}
		})
	}
}

// TestVersions: re-registering the same content keeps the version (and the
// slot); new content gets a new one, which a Fetch sees and the cache
// keeps until then.
func TestVersions(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	rec := recordOf(nodes[1], 3)
	for range 2 {
		if err := c.Register(ctx, rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	v1, err := c.Lookup(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	rec.DCTNum++
	if err := c.Register(ctx, rec, 0); err != nil {
		t.Fatal(err)
	}
	if cached, _ := c.Lookup(ctx, 3); cached != v1 {
		t.Fatalf("cache changed without a Fetch: %+v", cached)
	}
	v2, err := c.Fetch(ctx, 3)
	if err != nil || v2.Version <= v1.Version || v2.DCTNum != rec.DCTNum {
		t.Fatalf("after re-register: %+v (was %+v), %v", v2, v1, err)
	}
	if cached, _ := c.Lookup(ctx, 3); cached != v2 {
		t.Fatalf("Fetch did not refresh the cache: %+v", cached)
	}
	c.Invalidate(3)
	before := c.Stats().Misses
	if _, err := c.Lookup(ctx, 3); err != nil || c.Stats().Misses != before+1 {
		t.Fatalf("Lookup after Invalidate: %v, misses %d -> %d", err, before, c.Stats().Misses)
	}
}

// TestTableFull: a bucket takes Slots records; the next fails with
// ErrTableFull and leaves the others readable.
func TestTableFull(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{Buckets: 1, Slots: 2})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	for n := uint64(1); n <= 2; n++ {
		if err := c.Register(ctx, recordOf(nodes[1], n), 0); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Register(ctx, recordOf(nodes[1], 3), 0)
	if !errors.Is(err, ErrTableFull) {
		t.Fatalf("third record in a 2-slot table: %v", err)
	}
	t.Log(err)
	for n := uint64(1); n <= 2; n++ {
		if _, err := c.Fetch(ctx, n); err != nil {
			t.Fatalf("node %d: %v", n, err)
		}
	}
	if err := c.Deregister(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(ctx, recordOf(nodes[1], 3), 0); err != nil {
		t.Fatalf("register into a freed slot: %v", err)
	}
}

// TestLeaseExpiry: renewals keep a record alive for many leases; once its
// node stops renewing (the client closes, as a crashed node would) the
// server clears it within about a lease.
func TestLeaseExpiry(t *testing.T) {
	nodes := memNodes(t, 3)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{MinLease: time.Millisecond})
	owner, err := NewClient(nodes[1], []Info{srv.Info()}, fastClient)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	reader := startClient(t, nodes[2], []Info{srv.Info()}, fastClient)

	// A renewal is a chain of goroutine hand-offs (the renewer, the soft
	// RNIC, the server's loop, the reply back), each of which can wait
	// for a core: under -race on two loaded cores a chain took over the
	// 133 ms a 200 ms lease leaves after a renewal's period.
	const lease = 500 * time.Millisecond
	if err := owner.Register(ctx, recordOf(nodes[1], 11), lease); err != nil {
		t.Fatal(err)
	}
	if err := owner.Register(ctx, recordOf(nodes[1], 12), lease); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * lease) // lease time passing is what is tested
	v1, err := reader.Fetch(ctx, 11)
	if err != nil {
		t.Fatalf("record with live renewals gone after 3 leases: %v", err)
	}
	if _, err := reader.Fetch(ctx, 12); err != nil {
		t.Fatal(err)
	}
	if srv.Stats().Expired != 0 {
		t.Fatalf("expired while renewed: %+v", srv.Stats())
	}
	owner.Close()
	start := time.Now()
	eventually(t, 10*lease, "lapsed record cleared", func() bool {
		_, err := reader.Fetch(ctx, 11)
		return errors.Is(err, ErrNotFound)
	})
	t.Logf("record gone %v after its node stopped renewing (lease %v)", time.Since(start).Round(time.Millisecond), lease)
	eventually(t, 10*lease, "second record cleared", func() bool { return srv.Stats().Expired == 2 })
	// The slot was cleared under a newer version, not just zeroed.
	if v := slotVersionOf(srv, 11); v <= v1.Version {
		t.Fatalf("cleared slot has version %d, record had %d", v, v1.Version)
	}
}

// slotVersionOf finds the version of the slot node's record last occupied:
// the highest version among its bucket's empty slots.
func slotVersionOf(srv *Server, node uint64) uint64 {
	b := bucketOf(node, srv.cfg.Buckets)
	mem := srv.tblMem.Bytes()
	var v uint64
	for i := b * srv.cfg.Slots; i < (b+1)*srv.cfg.Slots; i++ {
		if r, err := decodeSlot(mem[i*SlotSize:]); err == nil && r.Node == 0 {
			v = max(v, r.Version)
		}
	}
	return v
}

// TestBadInput: invalid records and ids fail before anything is sent.
func TestBadInput(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	long := recordOf(nodes[1], 1)
	long.Addr = strings.Repeat("h", MaxAddr+1)
	for name, err := range map[string]error{
		"node 0":         c.Register(ctx, recordOf(nodes[1], 0), 0),
		"long address":   c.Register(ctx, long, 0),
		"negative lease": c.Register(ctx, recordOf(nodes[1], 1), -time.Second),
		"deregister 0":   c.Deregister(ctx, 0),
		"fetch 0":        func() error { _, err := c.Fetch(ctx, 0); return err }(),
	} {
		if !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v, want ErrBadRecord", name, err)
		}
	}
	if srv.Stats().Requests != 0 {
		t.Errorf("invalid input reached the server: %+v", srv.Stats())
	}
	if _, err := NewClient(nodes[1], nil, ClientConfig{}); err == nil {
		t.Error("NewClient without servers succeeded")
	}
	for _, g := range [][2]int{{0, MaxSlots + 1}, {0, -1}, {-1, 0}, {MaxBuckets + 1, 0}} {
		_, err := NewServer(nodes[0], ServerConfig{Buckets: g[0], Slots: g[1]})
		if !errors.Is(err, ErrBadGeometry) || !strings.Contains(err.Error(), fmt.Sprintf("%d buckets x %d slots", g[0], g[1])) {
			t.Errorf("server with %d buckets x %d slots: %v", g[0], g[1], err)
		}
	}
}

// TestTableSize: TableFor sizes a table for a cluster, and a server
// serves the table its config sizes, holding the cluster it was sized for.
func TestTableSize(t *testing.T) {
	for _, c := range []struct{ nodes, buckets int }{{1, 2}, {1000, 2048}, {10000, 32768}, {MaxBuckets, MaxBuckets}} {
		if b, s := TableFor(c.nodes); b != c.buckets || s != 8 || CheckTable(b, s) != nil {
			t.Errorf("TableFor(%d) = %d x %d, want %d x 8", c.nodes, b, s, c.buckets)
		}
	}
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	b, s := TableFor(100)
	srv := startServer(t, nodes[0], ServerConfig{Buckets: b, Slots: s})
	c := startClient(t, nodes[1], []Info{srv.Info()}, ClientConfig{})
	for i := uint64(1); i <= 100; i++ {
		if err := c.Register(ctx, recordOf(nodes[1], i), 0); err != nil {
			t.Fatalf("node %d in a table for 100: %v", i, err)
		}
	}
	if g, err := c.conns[0].geometry(ctx); err != nil || int(g.buckets) != b || int(g.slots) != s {
		t.Fatalf("served geometry %+v (%v), want %d x %d", g, err, b, s)
	}
}

// TestFailover: with two servers, a registration reaches both; when the
// first dies (node and all), Fetch fails over to the second and sticks to
// it, and Register/Deregister report the partial failure by server.
func TestFailover(t *testing.T) {
	nodes := memNodes(t, 3)
	ctx := testCtx(t)
	s1 := startServer(t, nodes[0], ServerConfig{})
	s2 := startServer(t, nodes[1], ServerConfig{})
	c := startClient(t, nodes[2], []Info{s1.Info(), s2.Info()}, fastClient)
	if err := c.Register(ctx, recordOf(nodes[2], 21), 0); err != nil {
		t.Fatal(err)
	}
	if s1.Stats().Records != 1 || s2.Stats().Records != 1 {
		t.Fatalf("records: %d and %d, want 1 on each", s1.Stats().Records, s2.Stats().Records)
	}
	if _, err := c.Fetch(ctx, 21); err != nil {
		t.Fatal(err)
	}

	s1.Close()
	nodes[0].Close()
	start := time.Now()
	if r, err := c.Fetch(ctx, 21); err != nil || r.Node != 21 {
		t.Fatalf("Fetch with the first server dead: %+v, %v", r, err)
	}
	t.Logf("failover took %v", time.Since(start).Round(time.Millisecond))
	if st := c.Stats(); st.Failovers != 1 || st.Recoveries == 0 {
		t.Fatalf("stats %+v: want 1 failover and a recovered DCI", st)
	}
	before := c.Stats()
	if _, err := c.Fetch(ctx, 21); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Reads != before.Reads+1 || st.Failovers != 1 {
		t.Fatalf("second Fetch: %d READs, %d failovers: it did not stick to the live server", st.Reads-before.Reads, st.Failovers)
	}

	err := c.Register(ctx, recordOf(nodes[2], 22), 0)
	var pe *PartialError
	if !errors.As(err, &pe) || pe.Succeeded != 1 || len(pe.Failed) != 1 || pe.Failed[0].Server != s1.Info() {
		t.Fatalf("Register with one server dead: %v", err)
	}
	if !errors.Is(err, ErrNoReply) {
		t.Fatalf("partial error does not wrap the cause: %v", err)
	}
	t.Log(err)
	if r, err := c.Fetch(ctx, 22); err != nil || r.Node != 22 {
		t.Fatalf("record registered on the live server only: %+v, %v", r, err)
	}
	if err := c.Deregister(ctx, 22); !errors.As(err, &pe) || pe.Op != "deregister" {
		t.Fatalf("Deregister with one server dead: %v", err)
	}
}

// TestAllServersDown: every server failing is an error naming each.
func TestAllServersDown(t *testing.T) {
	nodes := memNodes(t, 3)
	ctx := testCtx(t)
	s1 := startServer(t, nodes[0], ServerConfig{})
	s2 := startServer(t, nodes[1], ServerConfig{})
	c := startClient(t, nodes[2], []Info{s1.Info(), s2.Info()}, fastClient)
	if err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	s2.Close()
	_, err := c.Fetch(ctx, 5)
	if err == nil || !strings.Contains(err.Error(), s1.Info().Addr) || !strings.Contains(err.Error(), s2.Info().Addr) {
		t.Fatalf("Fetch with no server: %v", err)
	}
	if err := c.Register(ctx, recordOf(nodes[2], 5), 0); !errors.Is(err, ErrNoReply) {
		t.Fatalf("Register with no server: %v", err)
	}
}

// TestConcurrent: many goroutines Lookup, Fetch and Invalidate while
// records are rewritten, under -race.
func TestConcurrent(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{Buckets: 64})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	const records = 16
	for n := uint64(1); n <= records; n++ {
		if err := c.Register(ctx, recordOf(nodes[1], n), 0); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				node := uint64((g*7+i)%records + 1)
				var r Record
				var err error
				switch i % 4 {
				case 0:
					r, err = c.Fetch(ctx, node)
				case 1:
					c.Invalidate(node)
					fallthrough
				default:
					r, err = c.Lookup(ctx, node)
				}
				if err != nil || r.Node != node {
					errs <- fmt.Errorf("goroutine %d op %d node %d: %+v, %w", g, i, node, r, err)
					return
				}
			}
		})
	}
	wg.Go(func() { // rewrite records while they are read
		for i := range 50 {
			rec := recordOf(nodes[1], uint64(i%records+1))
			rec.DCTNum += uint32(i)
			if err := c.Register(ctx, rec, 0); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("stats %+v", c.Stats())
}

// TestClose: calls after Close fail with ErrClosed, Close is not
// repeatable, and client and server leave no verbs objects behind.
func TestClose(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv, err := NewServer(nodes[0], ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(nodes[1], []Info{srv.Info()}, fastClient)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Register(ctx, recordOf(nodes[1], 1), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Lookup(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lookup after Close: %v", err)
	}
	if err := c.Register(ctx, recordOf(nodes[1], 1), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second server Close: %v", err)
	}
	for _, n := range nodes {
		if st := n.Stats(); st.PDs+st.CQs+st.MRs+st.QPs+st.SRQs != 0 {
			t.Errorf("node %s keeps %+v", n.Addr(), st)
		}
	}
}

// TestCloseWhileBusy: Close returns promptly while lookups are in flight
// against a server that stopped answering, and they fail cleanly.
func TestCloseWhileBusy(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	cfg := fastClient
	cfg.ReadTimeout = 5 * time.Second // READs would wait this long
	c, err := NewClient(nodes[1], []Info{srv.Info()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	nodes[0].Close() // READs now hang until ReadTimeout
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := c.Fetch(ctx, 1); err == nil {
				t.Error("Fetch from a dead server succeeded")
			}
		})
	}
	eventually(t, 5*time.Second, "READs in flight", func() bool { return c.Stats().Reads >= 4 })
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close with READs in flight took %v", d)
	}
}

// TestRenewalRepairs: when a server loses a live node's record (here
// another client deregisters it; a restarted server is the same case) the
// node's next renewal is told "not found" and registers it again.
func TestRenewalRepairs(t *testing.T) {
	nodes := memNodes(t, 3)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{MinLease: time.Millisecond})
	var renewErrs sync.Map
	cfg := fastClient
	cfg.OnRenewError = func(node uint64, err error) { renewErrs.Store(node, err) }
	owner := startClient(t, nodes[1], []Info{srv.Info()}, cfg)
	other := startClient(t, nodes[2], []Info{srv.Info()}, fastClient)
	if err := owner.Register(ctx, recordOf(nodes[1], 5), 150*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := other.Deregister(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Fetch(ctx, 5); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after Deregister: %v", err)
	}
	eventually(t, 3*time.Second, "record re-registered by a renewal", func() bool {
		_, err := other.Fetch(ctx, 5)
		return err == nil
	})
	// A renewal that ran out of its period (a loaded machine: CI's -race at
	// load 10+) is retried next period; any other failure is a bug.
	renewErrs.Range(func(k, v any) bool {
		if err := v.(error); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("renewal of node %v failed: %v", k, err)
		}
		return true
	})
}

// TestEntries: the cache snapshot lists each cached node once, in node
// order, with its version and the time it was cached; an unchanged refetch
// keeps the time, a new version and Invalidate show.
func TestEntries(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	if e := c.Entries(); len(e) != 0 {
		t.Fatalf("entries before any lookup: %+v", e)
	}
	for _, n := range []uint64{9, 4} {
		if err := c.Register(ctx, recordOf(nodes[1], n), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Lookup(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	e := c.Entries()
	if len(e) != 2 || e[0].Node != 4 || e[1].Node != 9 {
		t.Fatalf("entries: %+v", e)
	}
	r9, _ := c.Lookup(ctx, 9)
	if x := e[1]; x.DCTNum != r9.DCTNum || x.CtrlQPN != r9.CtrlQPN || x.Version != r9.Version || x.Addr != r9.Addr ||
		x.Cached.IsZero() || x.Age < 0 || x.GID != "" {
		t.Fatalf("entry %+v for record %+v", x, r9)
	}
	if _, err := c.Fetch(ctx, 9); err != nil {
		t.Fatal(err)
	}
	if again := c.Entries(); again[1].Cached != e[1].Cached || again[1].Age < e[1].Age {
		t.Fatalf("an unchanged refetch moved the entry: %+v then %+v", e[1], again[1])
	}
	rec := recordOf(nodes[1], 9)
	rec.DCTNum++
	if err := c.Register(ctx, rec, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fetch(ctx, 9); err != nil {
		t.Fatal(err)
	}
	c.Invalidate(4)
	e2 := c.Entries()
	if len(e2) != 1 || e2[0].Node != 9 || e2[0].Version <= e[1].Version || e2[0].DCTNum != rec.DCTNum || e2[0].Cached.Before(e[1].Cached) {
		t.Fatalf("after a new version and Invalidate(4): %+v (was %+v)", e2, e)
	}
}
