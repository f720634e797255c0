package core_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// immModes are the routes a WRITE_WITH_IMM and its notification take: a
// DCI to the peer's DCT, and an RC QP.
var immModes = []mode{modeDC, modeNoDC}

// immConfig keeps DC mode's VQs on the DCIs, so that mode tests DC.
var immConfig = core.Config{DCIs: 1, RCPeers: -1}

// immPair starts two nodes: node 2 exports "ring" and binds srv to port 7;
// node 1's cli is bound to port 3 and connected to node 2's port 7.
func immPair(t *testing.T, m mode, cfg core.Config, size int) (cli, srv *core.Queue, ring krcore.MR, g krcore.Region, c *clusterT) {
	t.Helper()
	cl := m.start(t, 2, cfg)
	a, b := cl.Node(1), cl.Node(2)
	srv = mustQueue(t, b, 1)
	if err := srv.Bind(7); err != nil {
		t.Fatal(err)
	}
	ring = serve(t, b, "ring", size)
	cli = mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 7})
	if err := cli.Bind(3); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Region(ctx(t), "ring")
	if err != nil {
		t.Fatal(err)
	}
	return cli, srv, ring, g, &clusterT{a: a, b: b}
}

type clusterT struct{ a, b *core.Runtime }

// popMsg waits for one message on q.
func popMsg(t *testing.T, q *core.Queue) krcore.Message {
	t.Helper()
	var m [1]krcore.Message
	if _, err := q.PopMsgsWait(ctx(t), m[:]); err != nil {
		t.Fatal(err)
	}
	return m[0]
}

// TestWriteImmNotifies: each WRITE_WITH_IMM to a VQ connected to a port
// reaches the VQ bound there as a notification (Write, the immediate, the
// byte count, the writer's node and port), after its bytes are in the
// region: the receiver reads them at notification time while later
// writes are still on their way. It takes no posted receive buffer: the
// SEND after them lands in the one posted before them.
func TestWriteImmNotifies(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		const n, size = 32, 256
		cli, srv, ring, g, c := immPair(t, m, immConfig, n*size)
		inbox, _ := c.b.RegMR(64, verbs.AccessLocalWrite)
		if err := srv.PushRecv(inbox.Range(0, 64)); err != nil {
			t.Fatal(err)
		}
		src, _ := c.a.RegMR(n*size, verbs.AccessLocalWrite)
		reqs := make([]krcore.Request, n)
		for i := range reqs {
			copy(src.Bytes()[i*size:], bytes.Repeat([]byte{byte(i + 1)}, size))
			reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpWriteImm, Local: src.Range(i*size, size),
				Remote: g.At(uint64(i * size)), Imm: uint32(1000 + i)}
		}
		if _, err := cli.Push(ctx(t), true, reqs...); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			msg := popMsg(t, srv)
			if !msg.Write || !msg.HasImm || msg.Imm != uint32(1000+i) || msg.Len != size || msg.From != 1 || msg.Port != 3 ||
				msg.Buf != nil || msg.Data != nil || msg.Status != verbs.Success {
				t.Fatalf("notification %d: %+v", i, msg)
			}
			if got := ring.Bytes()[i*size : (i+1)*size]; !bytes.Equal(got, src.Bytes()[i*size:(i+1)*size]) {
				t.Fatalf("notification %d before its bytes: region holds %v...", i, got[:8])
			}
		}
		for i := range n {
			if wc := pop1(t, cli); wc.ID != uint64(i) || wc.Op != verbs.OpWriteImm || wc.Status != verbs.Success || wc.Len != size {
				t.Fatalf("completion %d: %+v", i, wc)
			}
		}
		copy(src.Bytes(), "after")
		if _, err := cli.Push(ctx(t), true, krcore.Request{ID: 99, Op: verbs.OpSend, Local: src.Range(0, 5)}); err != nil {
			t.Fatal(err)
		}
		msg := popMsg(t, srv)
		if msg.Write || msg.Buf == nil || msg.Buf.MR != inbox || string(inbox.Bytes()[:msg.Len]) != "after" {
			t.Fatalf("SEND after the notifications: %+v (a notification took the posted buffer?)", msg)
		}
		if st := c.b.Stats(); st.WriteImms != 0 || st.Dropped != 0 {
			t.Errorf("receiver stats %+v", st)
		}
	}, immModes...)
}

// TestWriteImmInOrder: SENDs, SEND_WITH_IMMs and WRITE_WITH_IMMs pushed
// on one VQ reach the bound VQ in push order, one inbox.
func TestWriteImmInOrder(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		const n = 60
		cli, srv, _, g, c := immPair(t, m, immConfig, 64)
		src, _ := c.a.RegMR(n*8, verbs.AccessLocalWrite)
		reqs := make([]krcore.Request, n)
		for i := range reqs {
			copy(src.Bytes()[i*8:], fmt.Sprintf("m%07d", i))
			r := krcore.Request{ID: uint64(i), Local: src.Range(i*8, 8), Imm: uint32(i)}
			switch i % 3 {
			case 0:
				r.Op = verbs.OpSend
			case 1:
				r.Op = verbs.OpWriteImm
				r.Remote = g.At(0)
			case 2:
				r.Op = verbs.OpSendImm
			}
			reqs[i] = r
		}
		for i := 0; i < n; i += 7 { // batches of several kinds
			if _, err := cli.Push(ctx(t), true, reqs[i:min(i+7, n)]...); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			msg := popMsg(t, srv)
			want := fmt.Sprintf("m%07d", i)
			switch i % 3 {
			case 0:
				if msg.Write || msg.HasImm || string(msg.Data) != want {
					t.Fatalf("message %d, want SEND %s: %+v", i, want, msg)
				}
			case 1:
				if !msg.Write || msg.Imm != uint32(i) || msg.Len != 8 {
					t.Fatalf("message %d, want WRITE_WITH_IMM %d: %+v", i, i, msg)
				}
			case 2:
				if msg.Write || !msg.HasImm || msg.Imm != uint32(i) || string(msg.Data) != want {
					t.Fatalf("message %d, want SEND_WITH_IMM %s: %+v", i, want, msg)
				}
			}
		}
	}, immModes...)
}

// TestWriteImmUnboundPort: a WRITE_WITH_IMM to a port nobody bound writes
// its bytes and completes; its notification is dropped and counted.
func TestWriteImmUnboundPort(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		cli, srv, ring, g, c := immPair(t, m, immConfig, 64)
		if err := cli.Connect(ctx(t), 2, &krcore.ConnectOptions{Port: 99}); err != nil {
			t.Fatal(err)
		}
		src, _ := c.a.RegMR(8, verbs.AccessLocalWrite)
		copy(src.Bytes(), "unbound!")
		if _, err := cli.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: src.Range(0, 8), Remote: g.At(0), Imm: 5}); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.Success {
			t.Fatalf("WRITE_WITH_IMM to an unbound port: %+v", wc)
		}
		// A SEND behind it on the same VQ and QP: once port 7 has it, the
		// receiver has dispatched the notification before it.
		if err := cli.Connect(ctx(t), 2, &krcore.ConnectOptions{Port: 7}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Push(ctx(t), true, krcore.Request{ID: 2, Op: verbs.OpSend, Local: src.Range(0, 8)}); err != nil {
			t.Fatal(err)
		}
		if msg := popMsg(t, srv); msg.Write || string(msg.Data) != "unbound!" {
			t.Fatalf("port 7 got %+v, want the SEND", msg)
		}
		if st := c.b.Stats(); st.Dropped != 1 || st.WriteImms != 0 {
			t.Errorf("receiver stats %+v, want 1 dropped", st)
		}
		if string(ring.Bytes()[:8]) != "unbound!" {
			t.Errorf("region holds %q", ring.Bytes()[:8])
		}
	}, immModes...)
}

// TestWriteImmCredits: a WRITE_WITH_IMM is one request to its VQ (one
// credit, one completion, one Outstanding) though it takes two entries of
// a shared send queue: with Depth 4 and two VQs of 4 credits each, 16
// entries wait their turn and all complete. An unsignaled one produces no
// completion and is retired by the next signaled request, and its
// notification arrives all the same.
func TestWriteImmCredits(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		cfg := immConfig
		cfg.Depth, cfg.Credits = 4, 4
		cli, srv, _, g, c := immPair(t, m, cfg, 64)
		cli2 := mustQueue(t, c.a, 2, &krcore.ConnectOptions{Port: 7})
		src, _ := c.a.RegMR(64, verbs.AccessLocalWrite)
		wi := func(id uint64) krcore.Request {
			return krcore.Request{ID: id, Op: verbs.OpWriteImm, Local: src.Range(0, 8), Remote: g.At(8 * (id % 8)), Imm: uint32(id)}
		}
		for _, q := range []*core.Queue{cli, cli2} {
			if n, err := q.Push(ctx(t), false, wi(0), wi(1), wi(2), wi(3), wi(4)); n != 4 || !errors.Is(err, krcore.ErrNoCredit) {
				t.Fatalf("push 5 with 4 credits: %d, %v", n, err)
			}
			if o := q.Outstanding(); o != 4 {
				t.Fatalf("outstanding %d, want 4", o)
			}
		}
		for _, q := range []*core.Queue{cli, cli2} {
			for i := range 4 {
				if wc := pop1(t, q); wc.ID != uint64(i) || wc.Status != verbs.Success {
					t.Fatalf("completion %d: %+v", i, wc)
				}
			}
			if o := q.Outstanding(); o != 0 {
				t.Fatalf("outstanding %d after popping, want 0", o)
			}
		}
		seen := map[uint32]int{}
		for range 8 {
			msg := popMsg(t, srv)
			if !msg.Write {
				t.Fatalf("not a notification: %+v", msg)
			}
			seen[msg.Imm]++
		}
		for i := range uint32(4) {
			if seen[i] != 2 {
				t.Fatalf("notifications by immediate %v, want 2 of each of 0..3", seen)
			}
		}
		un := wi(10)
		un.Unsignaled = true
		rd := krcore.Request{ID: 11, Op: verbs.OpRead, Local: src.Range(16, 8), Remote: g.At(0)}
		if _, err := cli.Push(ctx(t), true, un, rd); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.ID != 11 || wc.Status != verbs.Success {
			t.Fatalf("after an unsignaled WRITE_WITH_IMM: %+v, want the READ's", wc)
		}
		if o := cli.Outstanding(); o != 0 {
			t.Fatalf("outstanding %d after the READ, want 0", o)
		}
		if msg := popMsg(t, srv); !msg.Write || msg.Imm != 10 {
			t.Fatalf("unsignaled WRITE_WITH_IMM's notification: %+v", msg)
		}
	}, immModes...)
}

// TestWriteImmFailed: a WRITE_WITH_IMM whose WRITE the exporter's RNIC
// refuses (REM_ACCESS_ERR, past the region through a forged record)
// completes with that status and notifies nobody: the next notification
// the port sees is the next WRITE_WITH_IMM's. One on a VQ connected
// without a port is refused (LOC_QP_OP_ERR): its notification could reach
// no one.
func TestWriteImmFailed(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		cli, srv, _, g, c := immPair(t, m, immConfig, 64)
		src, _ := c.a.RegMR(8, verbs.AccessLocalWrite)
		forged := core.Forge(g, 4096, 0, 0, nil)
		bad := krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: src.Range(0, 8), Remote: forged.At(1024), Imm: 1}
		if _, err := cli.Push(ctx(t), true, bad); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.RemAccessErr {
			t.Fatalf("WRITE_WITH_IMM past the region: %+v, want REM_ACCESS_ERR", wc)
		}
		good := krcore.Request{ID: 2, Op: verbs.OpWriteImm, Local: src.Range(0, 8), Remote: g.At(0), Imm: 2}
		if _, err := cli.Push(ctx(t), true, good); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.Success {
			t.Fatalf("WRITE_WITH_IMM after the failure: %+v", wc)
		}
		if msg := popMsg(t, srv); !msg.Write || msg.Imm != 2 {
			t.Fatalf("first notification %+v, want the second WRITE_WITH_IMM's", msg)
		}
		if err := cli.Connect(ctx(t), 2, nil); err != nil {
			t.Fatal(err)
		}
		good.ID = 3
		if _, err := cli.Push(ctx(t), true, good); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.LocQPOpErr {
			t.Fatalf("WRITE_WITH_IMM without a port: %+v, want LOC_QP_OP_ERR", wc)
		}
		var more [1]krcore.Message
		if k := srv.PopMsgs(more[:]); k != 0 {
			t.Fatalf("port got %+v", more[0])
		}
	}, immModes...)
}
