package core_test

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestSendSizes: messages arrive whole, from any offset of the sender's
// MR, on both sides of the size a header slot carries (112 B: smaller
// messages are copied behind their header when posted, larger ones are
// gathered from the sender's MR), with and without an immediate.
func TestSendSizes(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{})
		a, b := c.Node(1), c.Node(2)
		srv, cli := portPair(t, c)
		in, _ := b.RegMR(4096, verbs.AccessLocalWrite)
		src, _ := a.RegMR(2*4096, verbs.AccessLocalWrite)
		for i := range src.Bytes() {
			src.Bytes()[i] = byte(i*7 + i/251)
		}
		for k, size := range []int{0, 1, 64, 111, 112, 113, 500, 4096} {
			off := 4096 - size/2 - k // not aligned, and away from the MR's start
			op := verbs.OpSend
			if k%2 == 1 {
				op = verbs.OpSendImm
			}
			if err := srv.PushRecv(in.Range(0, 4096)); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Push(ctx(t), true, krcore.Request{ID: uint64(k), Op: op, Imm: uint32(k), Local: src.Range(off, size)}); err != nil {
				t.Fatal(err)
			}
			if wc := pop1(t, cli); wc.Status != verbs.Success || wc.Len != size {
				t.Fatalf("%d B: %+v, want SUCCESS moving %d bytes", size, wc, size)
			}
			var msgs [1]krcore.Message
			if _, err := srv.PopMsgsWait(ctx(t), msgs[:]); err != nil {
				t.Fatal(err)
			}
			got := msgs[0]
			want := src.Bytes()[off : off+size]
			if got.Status != verbs.Success || got.Len != size || got.HasImm != (op == verbs.OpSendImm) || got.Buf == nil || !bytes.Equal(in.Bytes()[:size], want) {
				t.Fatalf("%s of %d B from offset %d: message %+v, bytes equal %v", op, size, off, got, bytes.Equal(in.Bytes()[:size], want))
			}
		}
	}, modeDC, modeNoDC)
}

// TestPopMsgsOrder: a PopMsgs that polls the receive queue itself hands
// back messages in arrival order, as many as out holds, the rest on the
// next call, whether they landed in a posted buffer or were kept as a copy
// (fewer buffers than messages), and whether the runtime's own receive
// waiter dispatched some of them first.
func TestPopMsgsOrder(t *testing.T) {
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	srv, cli := portPair(t, c)
	in, _ := b.RegMR(4096, verbs.AccessLocalWrite)
	src, _ := a.RegMR(64, verbs.AccessLocalWrite)
	const total = 40
	for round := range total / 5 {
		if err := srv.PushRecv(in.Range(0, 64), in.Range(64, 64)); err != nil { // 2 of every 5 land in a buffer
			t.Fatal(err)
		}
		for k := range 5 {
			src.Bytes()[0] = byte(round*5 + k)
			if _, err := cli.Push(ctx(t), true, krcore.Request{ID: uint64(k), Op: verbs.OpSend, Local: src.Range(0, 1)}); err != nil {
				t.Fatal(err)
			}
			pop1(t, cli)
		}
		var out [2]krcore.Message
		for next := round * 5; next < round*5+5; {
			n := srv.PopMsgs(out[:])
			for _, m := range out[:n] {
				data := m.Data
				if m.Buf != nil {
					data = m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
				}
				if m.Status != verbs.Success || m.Len != 1 || data[0] != byte(next) {
					t.Fatalf("message %d: %+v %v", next, m, data)
				}
				next++
			}
		}
	}
}
