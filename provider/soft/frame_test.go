package soft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

func encode(f *frame) []byte {
	b := make([]byte, 4+headerLen)
	f.putHeader(b, f.payloadLen())
	for _, s := range f.segs {
		b = append(b, s...)
	}
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	in := frame{typ: frameRequest, op: verbs.OpWriteImm, flags: flagImm, dstQPN: 7, srcQPN: 9, psn: 0xabcdef,
		rkey: 0xdeadbeef, raddr: 1 << 40, cmp: 3, swap: 4, imm: 5, rlen: 6, dckey: 7, segs: [][]byte{[]byte("abc"), []byte("de")}}
	b := encode(&in)
	var out frame
	if err := decodeHeader(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.plen != 5 || out.op != in.op || out.psn != in.psn || out.raddr != in.raddr || out.dckey != in.dckey || out.imm != in.imm {
		t.Fatalf("round trip: got %+v", out)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := encode(&frame{typ: frameRequest, op: verbs.OpRead, rlen: 8})
	cases := map[string]func(b []byte){
		"short length":   func(b []byte) { binary.BigEndian.PutUint32(b, headerLen-1) },
		"huge length":    func(b []byte) { binary.BigEndian.PutUint32(b, headerLen+maxPayload+1) },
		"bad type":       func(b []byte) { b[4] = 99 },
		"bad opcode":     func(b []byte) { b[5] = 0 },
		"read w/payload": func(b []byte) { binary.BigEndian.PutUint32(b, headerLen+8) },
		"bad syndrome":   func(b []byte) { b[4], b[6] = frameResponse, numSyndromes },
	}
	for name, mutate := range cases {
		b := bytes.Clone(good)
		mutate(b)
		var f frame
		if err := decodeHeader(b, &f); !errors.Is(err, errFrame) {
			t.Errorf("%s: got %v, want errFrame", name, err)
		}
	}
	if err := decodeHeader(good[:10], new(frame)); !errors.Is(err, errFrame) {
		t.Errorf("truncated header: got %v", err)
	}
}

// FuzzDecodeHeader: no input panics the decoder, and what it accepts
// encodes back to the same header.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(encode(&frame{typ: frameRequest, op: verbs.OpRead, rlen: 8}))
	f.Add(encode(&frame{typ: frameResponse, syn: synRNR}))
	f.Add(encode(&frame{typ: frameHello, segs: [][]byte{helloPayload("127.0.0.1:1")}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr frame
		if err := decodeHeader(b, &fr); err != nil {
			return
		}
		out := make([]byte, 4+headerLen)
		fr.putHeader(out, int(fr.plen))
		if !bytes.Equal(out[:4+60], b[:4+60]) {
			t.Fatalf("re-encoded header differs:\n%x\n%x", out[:64], b[:64])
		}
	})
}

// fuzzTarget is a node with QPs of every receiving kind, so fuzzed frames
// reach real request processing.
type fuzzTarget struct {
	node *Node
	qpns []uint32
	mr   verbs.MR
}

func newFuzzTarget(t testing.TB) *fuzzTarget {
	n, err := NewNode(Config{RetryTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(64)
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close(); blk.Close() })
	srq, _ := pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
	ft := &fuzzTarget{node: n, mr: mr}
	for _, typ := range []verbs.QPType{verbs.RC, verbs.UC, verbs.UD, verbs.DCT} {
		init := verbs.QPInit{Type: typ, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}, DCKey: 42}
		if typ == verbs.DCT {
			init.SRQ = srq
		}
		q, err := pd.CreateQP(init)
		if err != nil {
			t.Fatal(err)
		}
		if typ == verbs.RC || typ == verbs.UC {
			err = verbs.Connect(q, verbs.Endpoint{Addr: "fuzz:peer", QPN: 5}, verbs.Path{})
		} else {
			err = verbs.Ready(q, verbs.Path{})
		}
		if err != nil {
			t.Fatal(err)
		}
		if typ != verbs.DCT {
			q.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 64)}}})
		}
		ft.qpns = append(ft.qpns, q.Num())
	}
	return ft
}

// FuzzLink feeds arbitrary bytes to a node's link reader: it must neither
// panic nor hang, whatever frames, truncations and payloads arrive. Inputs
// of even length come over net.Pipe (plain reads), the others over TCP on
// loopback (raw reads in sessions, where the system has them).
func FuzzLink(f *testing.F) {
	seed := func(frs ...frame) []byte {
		var b []byte
		for i := range frs {
			b = append(b, encode(&frs[i])...)
		}
		return b
	}
	f.Add(seed(frame{typ: frameRequest, op: verbs.OpWrite, psn: 0, rkey: 1, segs: [][]byte{[]byte("12345678")}}))
	f.Add(seed(frame{typ: frameRequest, op: verbs.OpRead, rlen: 8}))
	f.Add(seed(frame{typ: frameRequest, op: verbs.OpFetchAdd, flags: flagDC, dckey: 42, rlen: 8}))
	f.Add(seed(frame{typ: frameRequest, op: verbs.OpSend, segs: [][]byte{make([]byte, 100)}}))
	f.Add(seed(frame{typ: frameResponse, syn: synAck, segs: [][]byte{[]byte("x")}}))
	f.Add(seed(frame{typ: frameRequest, op: verbs.OpWrite, rkey: 1, segs: [][]byte{make([]byte, directRead+5)}},
		frame{typ: frameRequest, op: verbs.OpWrite, psn: 1, rkey: 1, segs: [][]byte{[]byte("12345678")}}, frame{typ: frameResponse, syn: synAck}))
	ft := newFuzzTarget(f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, b []byte) {
		b = bytes.Clone(b)
		if len(b) >= 4+headerLen {
			// Aim at a live QP and, now and then, at the real MR.
			binary.BigEndian.PutUint32(b[8:], ft.qpns[int(b[8])%len(ft.qpns)])
			if b[9]&1 == 0 {
				binary.BigEndian.PutUint32(b[20:], ft.mr.RKey())
				binary.BigEndian.PutUint64(b[24:], ft.mr.Addr()+uint64(b[10]))
			}
		}
		var near, far net.Conn
		if len(b)%2 == 0 {
			near, far = net.Pipe()
		} else {
			var err error
			if far, err = net.Dial("tcp", ln.Addr().String()); err != nil {
				t.Fatal(err)
			}
			if near, err = ln.Accept(); err != nil {
				t.Fatal(err)
			}
		}
		l := newTCPLink(ft.node, "fuzz:peer")
		l.conn = near
		var wg sync.WaitGroup
		done := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer close(done)
			ft.node.readLoop(l, near)
		}()
		go func() {
			defer wg.Done()
			// Drain responses so the reader never blocks writing.
			buf := make([]byte, 4096)
			for {
				if _, err := far.Read(buf); err != nil {
					return
				}
			}
		}()
		far.SetWriteDeadline(time.Now().Add(time.Second))
		far.Write(b)
		if tc, ok := far.(*net.TCPConn); ok {
			tc.CloseWrite()
		} else {
			far.Close()
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("link reader hung")
		}
		far.Close()
		wg.Wait()
	})
}
