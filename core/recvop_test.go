package core_test

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestWriteImmNotAMessage: a raw WRITE_WITH_IMM (as a writer that is not
// a krcore runtime posts it, without a notification) consumes a shared
// receive slot that still holds an earlier SEND's payload for another
// port, and its immediate names a bound port. That port's VQ must not
// receive the slot's stale bytes (nor anything): a receive completion is
// dispatched by its opcode, and only a SEND's is a message. With four
// slots, the third SEND to port A and the WRITE_WITH_IMM share nothing but
// the slots' reuse.
func TestWriteImmNotAMessage(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, RecvSlots: 4})
		a, b := c.Node(1), c.Node(2)
		const portA, portB = 7, 9
		srvA, srvB := mustQueue(t, b, 1), mustQueue(t, b, 1)
		if err := srvA.Bind(portA); err != nil {
			t.Fatal(err)
		}
		if err := srvB.Bind(portB); err != nil {
			t.Fatal(err)
		}
		target := serve(t, b, "target", 64)
		cliA := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: portA})
		cliB := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: portB})
		writer := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: portB})
		g, err := writer.Region(ctx(t), "target")
		if err != nil {
			t.Fatal(err)
		}
		src, _ := a.RegMR(64, verbs.AccessLocalWrite)
		push := func(q *core.Queue, r krcore.Request) {
			t.Helper()
			if _, err := q.Push(ctx(t), true, r); err != nil {
				t.Fatal(err)
			}
			if wc := pop1(t, q); wc.Status != verbs.Success {
				t.Fatalf("%s: %+v", r.Op, wc)
			}
		}
		secret := bytes.Repeat([]byte("A-secret"), 4)
		copy(src.Bytes(), secret)
		var msgs [8]krcore.Message
		for i := 0; i < 4; i++ { // fill every slot once with port A's bytes
			push(cliA, krcore.Request{ID: uint64(i), Op: verbs.OpSend, Local: src.Range(0, len(secret))})
			if _, err := srvA.PopMsgsWait(ctx(t), msgs[:1]); err != nil {
				t.Fatal(err)
			}
		}
		copy(src.Bytes(), bytes.Repeat([]byte{'w'}, 32))
		if err := core.PushRaw(ctx(t), writer, krcore.Request{ID: 10, Op: verbs.OpWriteImm, Local: src.Range(0, 32), Remote: g.At(0), Imm: portB}); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, writer); wc.Status != verbs.Success {
			t.Fatalf("raw WRITE_WITH_IMM: %+v", wc)
		}
		if !bytes.Equal(target.Bytes()[:32], src.Bytes()[:32]) {
			t.Fatalf("WRITE_WITH_IMM did not land: %q", target.Bytes()[:32])
		}
		// A SEND to port B on the same QP, after the WRITE_WITH_IMM: the
		// first message port B sees must be this one.
		copy(src.Bytes(), "B-message")
		push(cliB, krcore.Request{ID: 11, Op: verbs.OpSend, Local: src.Range(0, 9)})
		if _, err := srvB.PopMsgsWait(ctx(t), msgs[:1]); err != nil {
			t.Fatal(err)
		}
		if got := msgs[0].Data; string(got) != "B-message" {
			t.Fatalf("port B's first message is %q (from %d port %d), want B-message", got, msgs[0].From, msgs[0].Port)
		}
		if n := srvB.PopMsgs(msgs[:]); n != 0 {
			t.Errorf("port B got %d more messages", n)
		}
		if n := srvA.PopMsgs(msgs[:]); n != 0 {
			t.Errorf("port A got %d more messages", n)
		}
		if st := b.Stats(); st.WriteImms != 1 {
			t.Errorf("WriteImms %d, want 1", st.WriteImms)
		}
	}, modeDC, modeNoDC)
}
