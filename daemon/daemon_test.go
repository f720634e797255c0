package daemon_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestHostileRing: a client that writes nonsense into its rings and sends
// malformed control messages loses only its own VQ; a well-behaved client
// carries on, and the metrics show both.
func TestHostileRing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mem, _ := c.Node(2).RegMR(4096, verbs.AccessAll)
	c.Node(2).Export("t", mem, 0, 4096, verbs.AccessRemoteRead)
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { srv.Close(); <-done }()

	// the hostile client speaks the wire protocol by hand
	nc, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	conn := nc.(*net.UnixConn)
	call := func(m *wire.Msg) *wire.Msg {
		if err := wire.Send(conn, m); err != nil {
			t.Fatal(err)
		}
		r, err := wire.Recv(conn)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := call(wire.NewMsg(wire.OpHello, 1).U32(wire.Version))
	r.GetU64()
	r.GetU64()
	r.GetU32()
	maxMsg := int(r.GetU32())
	if r := call(wire.NewMsg(wire.OpConnect, 2)); r.Error() == nil { // short body
		t.Error("malformed connect accepted")
	}
	blk, _ := offheap.AllocShared("hostile", wire.RingSize(maxMsg))
	defer blk.Close()
	fds := []int{blk.FD()}
	var bells []*wire.Bell
	for range 3 {
		b, _ := wire.NewBell()
		defer b.Close()
		bells = append(bells, b)
		fds = append(fds, b.FD())
	}
	m := wire.NewMsg(wire.OpQueue, 3)
	m.FDs = fds
	if r := call(m); r.Error() != nil {
		t.Fatal(r.Error())
	}
	ring, _ := wire.NewRing(blk.Bytes(), maxMsg)
	ring.Ctr(wire.SQTail).Store(1 << 40) // far beyond the ring
	bells[0].Ring()                      // the doorbell

	good, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	q, _ := good.Queue()
	q.Connect(ctx, 2, nil)
	g, err := q.Region(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := good.RegMR(64, verbs.AccessAll)
	for i := range 200 {
		q.Push(ctx, true, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
		var out [1]krcore.Completion
		if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			t.Fatalf("good client: %v %v", err, out[0].Err())
		}
	}
	fams := scrape(t, srv)
	for _, want := range [][]string{{"krcored_vqs"}, {"krcored_pool_qps", "type", "dci"}, {"krcored_meta_cache_hits_total"},
		{"krcored_client_refusals_total", "client", strconv.FormatUint(good.ID(), 10)}, {"krcored_connects_total"}, {"krcored_meta_cache_entries"}} {
		if series(fams, want[0], want[1:]...) == nil {
			t.Errorf("metrics lack %v", want)
		}
	}
	st := srv.Status()
	rows := map[string]int{}
	for _, p := range st.QPs {
		rows[p.Type]++
	}
	for _, p := range st.Pool {
		if rows[p.Type] < p.Count {
			t.Errorf("%d %s QPs counted, %d listed: %+v", p.Count, p.Type, rows[p.Type], st.QPs)
		}
	}
	if !slices.ContainsFunc(st.MetaEntries, func(e meta.CacheEntry) bool { return e.Node == 2 && e.Version != 0 }) {
		t.Errorf("meta cache entries %+v, want node 2's", st.MetaEntries)
	}
	for _, cs := range st.Clients {
		if cs.ID != good.ID() && cs.Refusals < 2 {
			t.Errorf("hostile client's refusals: %d, want the bad connect and the broken ring", cs.Refusals)
		}
	}
}
