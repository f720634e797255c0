package core_test

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestRecvHold: a port's posted receive buffers in the MR its first
// buffers came from rely on one use the queue keeps of it (no use taken
// and dropped per message), buffers in any other MR on a use each; the
// kept use goes when the MR is deregistered (at once, whatever is
// posted or was) or the queue closes, and messages then land where they
// did before.
func TestRecvHold(t *testing.T) {
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	srv := mustQueue(t, b, 1)
	if err := srv.Bind(7); err != nil {
		t.Fatal(err)
	}
	in, _ := b.RegMR(4096, verbs.AccessLocalWrite)
	other, _ := b.RegMR(4096, verbs.AccessLocalWrite)
	if err := srv.PushRecv(in.Range(0, 64), in.Range(64, 64)); err != nil {
		t.Fatal(err)
	}
	uses := func(when string, mr krcore.MR, want int64) {
		t.Helper()
		if n := core.MRUses(mr); n != want {
			t.Fatalf("%s: %d uses, want %d", when, n, want)
		}
	}
	uses("two buffers posted", in, 1)
	cli := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 7})
	msg, _ := a.RegMR(64, verbs.AccessLocalWrite)
	var got [1]krcore.Message
	send := func(s string) krcore.Message {
		t.Helper()
		copy(msg.Bytes(), s)
		if _, err := cli.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: msg.Range(0, len(s))}); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.Success {
			t.Fatalf("send %q: %+v", s, wc)
		}
		if _, err := srv.PopMsgsWait(ctx(t), got[:]); err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	for i := range 8 {
		m := send("ping")
		if m.Buf == nil || m.Buf.MR != krcore.MR(in) || !bytes.Equal(in.Bytes()[m.Buf.Off:m.Buf.Off+m.Len], []byte("ping")) {
			t.Fatalf("message %d: %+v", i, m)
		}
		uses("a message delivered", in, 1)
		if err := srv.PushRecv(*m.Buf); err != nil {
			t.Fatal(err)
		}
		uses("its buffer posted back", in, 1)
	}
	// Another MR's buffers take a use each, dropped as messages land.
	if err := srv.PushRecv(other.Range(0, 64)); err != nil {
		t.Fatal(err)
	}
	uses("a buffer in another MR posted", other, 1)
	uses("a buffer in another MR posted", in, 1)
	send("one")
	send("two") // the two in in, oldest first
	uses("both buffers in the held MR taken", in, 1)
	if m := send("three"); m.Buf == nil || m.Buf.MR != krcore.MR(other) {
		t.Fatalf("third message: %+v, want it in the other MR", m)
	}
	uses("the other MR's buffer taken", other, 0)
	// The held MR, idle, is let go by its deregistration; a message then
	// finds no buffer and is kept as a copy.
	if err := b.Deregister(in); err != nil {
		t.Fatal(err)
	}
	uses("held MR deregistered", in, 0)
	if m := send("four"); m.Buf != nil || !bytes.Equal(m.Data, []byte("four")) {
		t.Fatalf("message after the deregistration: %+v", m)
	}
	// With none posted, the next buffers' MR is held: deregistering it
	// with buffers posted drops them and the hold.
	if err := srv.PushRecv(other.Range(0, 64), other.Range(64, 64)); err != nil {
		t.Fatal(err)
	}
	uses("two buffers posted in the other MR", other, 1)
	third, _ := b.RegMR(4096, verbs.AccessLocalWrite)
	if err := srv.PushRecv(third.Range(0, 64)); err != nil {
		t.Fatal(err)
	}
	uses("a buffer posted behind them", third, 1)
	if err := b.Deregister(other); err != nil {
		t.Fatal(err)
	}
	uses("held MR deregistered with buffers posted", other, 0)
	if m := send("five"); m.Buf == nil || m.Buf.MR != krcore.MR(third) {
		t.Fatalf("message after the deregistration: %+v, want it in the third MR", m)
	}
	uses("the third MR's buffer taken", third, 0)
	// Closing the queue drops the hold and the buffers' uses.
	if err := srv.PushRecv(third.Range(0, 64), third.Range(64, 64)); err != nil {
		t.Fatal(err)
	}
	uses("two posted in the third MR", third, 1)
	srv.Close()
	uses("queue closed", third, 0)
}
