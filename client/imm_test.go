package client_test

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestWriteImmNotification: through krcored, a WRITE_WITH_IMM into a
// client's exported region reaches the client's VQ bound to the port as a
// notification (Write, immediate, byte count; no data, no posted buffer
// taken), after the bytes and in order with a SEND behind it; and a
// client's own WRITE_WITH_IMM notifies an embedded node's VQ, or is
// refused (LOC_QP_OP_ERR) on a VQ connected without a port.
func TestWriteImmNotification(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Bind(7); err != nil {
		t.Fatal(err)
	}
	ring, _ := c.RegMR(4096, verbs.AccessAll)
	if err := c.Export("ring", ring, 0, 4096, verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	inbox, _ := c.RegMR(64, verbs.AccessLocalWrite)
	if err := q.PushRecv(inbox.Range(0, 64)); err != nil {
		t.Fatal(err)
	}
	// The daemon takes the posted buffer from the submission ring, in
	// order with requests: once a READ behind it completes, it is posted.
	if err := q.Connect(ctx, 2, &krcore.ConnectOptions{Port: 80}); err != nil {
		t.Fatal(err)
	}
	tbl, err := c.Region(ctx, 2, "table")
	if err != nil {
		t.Fatal(err)
	}
	if out := run(t, ctx, q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: ring.Range(0, 8), Remote: tbl.At(0)}); out[0].Err() != nil {
		t.Fatal(out[0].Err())
	}

	n2 := e.c.Node(2)
	srv, err := n2.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Bind(80); err != nil {
		t.Fatal(err)
	}
	if err := srv.Connect(ctx, 1, &krcore.ConnectOptions{Port: 7}); err != nil {
		t.Fatal(err)
	}
	g, err := srv.Region(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	src, _ := n2.RegMR(4096, verbs.AccessLocalWrite)
	copy(src.Bytes(), bytes.Repeat([]byte("ring"), 1024))
	copy(src.Bytes()[4000:], "then a SEND")
	if _, err := srv.Push(ctx, true,
		krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: src.Range(0, 4000), Remote: g.At(0), Imm: 0xc0ffee},
		krcore.Request{ID: 2, Op: verbs.OpSend, Local: src.Range(4000, 11)}); err != nil {
		t.Fatal(err)
	}
	var m [1]krcore.Message
	if _, err := q.PopMsgsWait(ctx, m[:]); err != nil {
		t.Fatal(err)
	}
	if !m[0].Write || !m[0].HasImm || m[0].Imm != 0xc0ffee || m[0].Len != 4000 || m[0].From != 2 || m[0].Port != 80 ||
		m[0].Buf != nil || m[0].Data != nil {
		t.Fatalf("notification %+v", m[0])
	}
	if !bytes.Equal(ring.Bytes()[:4000], src.Bytes()[:4000]) {
		t.Fatal("notified before the bytes were in the client's region")
	}
	if _, err := q.PopMsgsWait(ctx, m[:]); err != nil {
		t.Fatal(err)
	}
	if m[0].Write || m[0].Buf == nil || string(inbox.Bytes()[:m[0].Len]) != "then a SEND" {
		t.Fatalf("SEND after the notification: %+v", m[0])
	}

	// The client writes back into node 2's table with an immediate.
	copy(ring.Bytes()[100:], "reply!")
	out := run(t, ctx, q, krcore.Request{ID: 3, Op: verbs.OpWriteImm, Local: ring.Range(100, 6), Remote: tbl.At(64), Imm: 9})
	if out[0].Status != verbs.Success || out[0].Len != 6 {
		t.Fatalf("client WRITE_WITH_IMM: %+v", out[0])
	}
	if _, err := srv.PopMsgsWait(ctx, m[:]); err != nil {
		t.Fatal(err)
	}
	if !m[0].Write || m[0].Imm != 9 || m[0].Len != 6 || m[0].From != 1 || m[0].Port != 7 || string(e.table.Bytes()[64:70]) != "reply!" {
		t.Fatalf("node 2's notification %+v, table %q", m[0], e.table.Bytes()[64:70])
	}
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	out = run(t, ctx, q, krcore.Request{ID: 4, Op: verbs.OpWriteImm, Local: ring.Range(100, 6), Remote: tbl.At(64), Imm: 9})
	if out[0].Status != verbs.LocQPOpErr {
		t.Fatalf("WRITE_WITH_IMM without a port: %+v, want LOC_QP_OP_ERR", out[0])
	}
}
