package racekv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/verbs"
)

// localTable formats a table of g in this process's memory and returns a
// Memory per node.
func localTable(t *testing.T, g Geometry) []Memory {
	t.Helper()
	var mems []Memory
	for i := range g.Nodes {
		mem := make([]byte, g.RegionSize())
		if err := Format(mem, g, i); err != nil {
			t.Fatal(err)
		}
		mems = append(mems, NewLocal(mem))
	}
	return mems
}

func open(t *testing.T, mems []Memory) *Client {
	t.Helper()
	c, err := Open(context.Background(), mems)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func key(i int) []byte { return []byte("user" + strconv.Itoa(i)) }

// TestPutGet: puts then gets many keys over two memory nodes; updates
// replace; a key never put is missing.
func TestPutGet(t *testing.T) {
	ctx := context.Background()
	mems := localTable(t, ForKeys(2000, 2, 1<<20))
	c := open(t, mems)
	for i := range 2000 {
		if err := c.Put(ctx, key(i), []byte(fmt.Sprint("v", i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i := 0; i < 2000; i += 3 {
		if err := c.Put(ctx, key(i), []byte(fmt.Sprint("w", i))); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	other := open(t, mems) // another client sees the same table
	for i := range 2000 {
		want := fmt.Sprint("v", i)
		if i%3 == 0 {
			want = fmt.Sprint("w", i)
		}
		v, ok, err := other.Get(ctx, key(i))
		if err != nil || !ok || string(v) != want {
			t.Fatalf("get %d = %q, %v, %v; want %q", i, v, ok, err, want)
		}
	}
	if v, ok, err := other.Get(ctx, []byte("absent")); ok || err != nil {
		t.Fatalf("absent key: %q, %v, %v", v, ok, err)
	}
}

// TestOneSlotPerKey: every key put (and updated) holds exactly one slot,
// and the slots' fingerprints and lengths match their blocks.
func TestOneSlotPerKey(t *testing.T) {
	ctx := context.Background()
	g := ForKeys(500, 1, 1<<20)
	mem := make([]byte, g.RegionSize())
	Format(mem, g, 0)
	c := open(t, []Memory{NewLocal(mem)})
	for round := range 3 {
		for i := range 500 {
			if err := c.Put(ctx, key(i), []byte(strconv.Itoa(round))); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]int{}
	for off := HeaderSize; off < HeaderSize+g.tableBytes(); off += SlotSize {
		s := slot(words.Uint64(mem[off:]))
		if s.isEmpty() {
			continue
		}
		k, v, ok := decodeBlock(mem[s.off() : s.off()+uint64(s.size())])
		if !ok || placeOf(g, k).fp != s.fp() || string(v) != "2" {
			t.Fatalf("slot at %d: block %q=%q (ok %v), fingerprint %d", off, k, v, ok, s.fp())
		}
		seen[string(k)]++
	}
	if len(seen) != 500 {
		t.Fatalf("%d keys in the table, want 500", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("key %s holds %d slots", k, n)
		}
	}
}

// TestConcurrentInsert: clients racing to insert the same new keys leave
// one slot per key, and every client then reads one of the values put.
func TestConcurrentInsert(t *testing.T) {
	ctx := context.Background()
	mems := localTable(t, ForKeys(100, 1, 4<<20))
	const clients, keys = 4, 100
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for w := range clients {
		c := open(t, mems)
		wg.Go(func() {
			for i := range keys {
				if err := c.Put(ctx, key(i), []byte(strconv.Itoa(w))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c := open(t, mems)
	for i := range keys {
		v, ok, err := c.Get(ctx, key(i))
		if n, _ := strconv.Atoi(string(v)); err != nil || !ok || n < 0 || n >= clients {
			t.Fatalf("key %d: %q, %v, %v", i, v, ok, err)
		}
	}
}

// TestErrors: too large a block, a full bucket pair, a used-up heap and a
// region that is no table are errors, not panics.
func TestErrors(t *testing.T) {
	ctx := context.Background()
	c := open(t, localTable(t, Geometry{Nodes: 1, Subtables: 1, Groups: 1, Heap: 1 << 20}))
	if err := c.Put(ctx, []byte("k"), make([]byte, MaxBlock)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("huge value: %v", err)
	}
	var err error
	for i := 0; err == nil && i < 100; i++ { // one group holds 24 slots
		err = c.Put(ctx, key(i), []byte("v"))
	}
	if !errors.Is(err, ErrFull) {
		t.Fatalf("one group, 100 keys: %v", err)
	}
	c = open(t, localTable(t, Geometry{Nodes: 1, Subtables: 1, Groups: 64, Heap: 2 * chunkSize}))
	val := make([]byte, 1000)
	err = nil
	for i := 0; err == nil && i < 1000; i++ {
		err = c.Put(ctx, key(i), val)
	}
	if !errors.Is(err, ErrFull) {
		t.Fatalf("heap of two chunks, 1000 blocks of 1 KiB: %v", err)
	}
	if _, err := Open(ctx, []Memory{NewLocal(make([]byte, 4096))}); !errors.Is(err, ErrFormat) {
		t.Fatalf("unformatted region: %v", err)
	}
	if err := Format(make([]byte, 10), Geometry{Nodes: 2, Subtables: 3, Groups: 1}, 0); !errors.Is(err, ErrFormat) {
		t.Fatalf("bad geometry: %v", err)
	}
	if err := NewLocal(make([]byte, 64)).Do(ctx, &Op{Kind: verbs.OpRead, Off: 60, Buf: make([]byte, 8)}); err == nil {
		t.Fatal("read beyond the region succeeded")
	}
}

// TestTransports: clients through a VQ (embedded and through krcored) and
// through a raw RC QP read and update one memory node's table alike; the
// RC client starts after the exchange's deadline has passed, which must
// not end its QP.
func TestTransports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func(d time.Duration) { exchangeTimeout = d }(exchangeTimeout)
	exchangeTimeout = time.Second
	cl, sock := testcluster.StartDaemon(t, 3) // node 2 is the memory node
	memAPI := core.Embed(cl.Node(2))
	g := ForKeys(200, 1, 1<<20)
	node, err := NewNode(memAPI, g, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	loader := open(t, []Memory{node.Local()})
	for i := range 200 {
		if err := loader.Put(ctx, key(i), []byte("v0")); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- node.ServeRC(srvCtx, cl.Devices[1], ln, verbs.Path{}) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	dials := map[string]func() (Memory, error){
		"rc":       func() (Memory, error) { return DialRC(ctx, cl.Devices[2], ln.Addr().String(), verbs.Path{}) },
		"embedded": func() (Memory, error) { return DialVQ(ctx, core.Embed(cl.Node(1)), 2, Name) },
		"daemon":   func() (Memory, error) { return DialVQ(ctx, testcluster.Attach(t, sock), 2, Name) },
	}
	for _, name := range []string{"rc", "embedded", "daemon"} {
		t.Run(name, func(t *testing.T) {
			m, err := dials[name]()
			if err != nil {
				t.Fatal(err)
			}
			c := open(t, []Memory{m})
			defer c.Close()
			if name == "rc" {
				time.Sleep(2 * exchangeTimeout) // the client idles past the exchange's deadline
			}
			for i := range 200 {
				if v, ok, err := c.Get(ctx, key(i)); err != nil || !ok || len(v) < 2 {
					t.Fatalf("get %d: %q %v %v", i, v, ok, err)
				}
				if err := c.Put(ctx, key(i), []byte(name)); err != nil {
					t.Fatalf("put %d: %v", i, err)
				}
				if v, ok, err := c.Get(ctx, key(i)); err != nil || !ok || string(v) != name {
					t.Fatalf("get %d after put: %q %v %v", i, v, ok, err)
				}
			}
			if err := m.Do(ctx, &Op{Kind: verbs.OpRead, Off: uint64(g.RegionSize()), Buf: make([]byte, 8)}); err == nil {
				t.Fatal("a READ beyond the region succeeded")
			}
		})
	}
	// A client that sends a bad endpoint gets an error back, not a hang.
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := control.NewConn(ctx, conn)
	defer c.Close()
	var remote *control.RemoteError
	if _, err := c.Call(&control.Msg{Op: control.OpConnCreate, EP: []byte("junk")}, 10*time.Second); !errors.As(err, &remote) {
		t.Fatalf("bad endpoint: %v", err)
	}
}
