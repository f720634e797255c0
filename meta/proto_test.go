package meta

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

func sampleRequest(o op) request {
	r := request{
		op: o, id: 0xabcdef, node: 42, lease: 3 * time.Second,
		reply: verbs.Endpoint{Addr: "mem:client", GID: verbs.GID{1, 2, 3}, LID: 9, QPN: 0x777},
	}
	if o == opRegister {
		r.rec = sampleRecord(42)
	}
	return r
}

func TestRequestRoundTrip(t *testing.T) {
	for _, o := range []op{opHello, opRegister, opRenew, opDeregister} {
		want := sampleRequest(o)
		b := want.encode(nil)
		if len(b) > maxRequest {
			t.Fatalf("%s: %d bytes, max %d", o, len(b), maxRequest)
		}
		got, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		if got != want {
			t.Fatalf("%s: got %+v, want %+v", o, got, want)
		}
		if err := got.validate(); err != nil {
			t.Fatalf("%s: validate: %v", o, err)
		}
	}
}

func TestRequestMalformed(t *testing.T) {
	good := sampleRequest(opRegister)
	enc := good.encode(nil)
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(enc)) }
	cases := map[string][]byte{
		"empty":          {},
		"short":          enc[:reqFixedLen-1],
		"magic":          mutate(func(b []byte) []byte { b[0]++; return b }),
		"version":        mutate(func(b []byte) []byte { b[2] = 9; return b }),
		"op 0":           mutate(func(b []byte) []byte { b[3] = 0; return b }),
		"op reply":       mutate(func(b []byte) []byte { b[3] = byte(opRegister | opReply); return b }),
		"no address":     mutate(func(b []byte) []byte { b[34] = 0; clear(b[32:34]); clear(b[48:64]); return b[:reqFixedLen] }),
		"long address":   mutate(func(b []byte) []byte { b[34]++; return b }),
		"trailing bytes": append(bytes.Clone(enc), 0),
		"reply QPN 0":    mutate(func(b []byte) []byte { clear(b[4:8]); return b }),
		"torn record":    mutate(func(b []byte) []byte { b[reqHeaderLen+20] ^= 1; return b }),
	}
	for name, b := range cases {
		if _, err := decodeRequest(b); !errors.Is(err, errMalformed) {
			t.Errorf("%s: err %v, want errMalformed", name, err)
		}
	}
	// A RoCE port has no fabric address: its GID names it.
	roce := sampleRequest(opHello)
	roce.reply.Addr = ""
	if got, err := decodeRequest(roce.encode(nil)); err != nil || got.reply != roce.reply {
		t.Errorf("request with a GID and no address: %+v, %v", got.reply, err)
	}
}

func TestRequestValidate(t *testing.T) {
	bad := map[string]request{}
	r := sampleRequest(opRenew)
	r.node = 0
	bad["node 0"] = r
	r = sampleRequest(opRenew)
	r.lease = -1
	bad["negative lease"] = r
	r = sampleRequest(opRegister)
	r.rec.Node = 43
	bad["record of another node"] = r
	r = sampleRequest(opRegister)
	r.rec.Addr = strings.Repeat("a", MaxAddr+1)
	bad["address too long"] = r
	for name, r := range bad {
		if err := r.validate(); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v, want ErrBadRecord", name, err)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	want := reply{
		op: opHello, status: stTableFull, id: 5, node: 6, version: 7, lease: time.Minute,
		geo: geometry{addr: 1 << 40, rkey: 99, buckets: 1024, slots: 4, slotSize: SlotSize, dct: 0x55, dcKey: 0x66, epoch: 0x77, maxLease: time.Hour},
	}
	var b [replyLen]byte
	want.encode(b[:])
	got, err := decodeReply(b[:])
	if err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if _, err := decodeReply(b[:replyLen-1]); err == nil {
		t.Fatal("short reply decoded")
	}
	b[3] = byte(opHello) // not a reply
	if _, err := decodeReply(b[:]); err == nil {
		t.Fatal("a request header decoded as a reply")
	}
}

func TestGeometryCheck(t *testing.T) {
	g := geometry{rkey: 1, buckets: 1, slots: 4, slotSize: SlotSize}
	if err := g.check(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []geometry{
		{rkey: 1, buckets: 1, slots: MaxSlots + 1, slotSize: SlotSize},
		{rkey: 1, buckets: 1, slots: 4, slotSize: 64},
		{rkey: 1, buckets: 0, slots: 4, slotSize: SlotSize},
	} {
		if err := bad.check(); !errors.Is(err, ErrBadGeometry) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

func TestStatusErrors(t *testing.T) {
	for st, want := range map[status]error{stNotFound: ErrNotFound, stTableFull: ErrTableFull, stInvalid: ErrBadRecord} {
		if !errors.Is(st.err(), want) {
			t.Errorf("status %d: %v, want %v", st, st.err(), want)
		}
	}
	if stOK.err() != nil || status(99).err() == nil {
		t.Error("status 0 must be nil and unknown statuses errors")
	}
}

// FuzzDecodeRequest: no input crashes the server's decoder, and anything it
// accepts re-encodes to the same bytes (so nothing is silently ignored).
func FuzzDecodeRequest(f *testing.F) {
	for _, o := range []op{opHello, opRegister, opRenew, opDeregister} {
		r := sampleRequest(o)
		f.Add(r.encode(nil))
	}
	f.Add([]byte{})
	f.Add(make([]byte, reqFixedLen+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			return
		}
		_ = r.validate()
		if r.op != opRegister {
			return // a non-register request ignores the record area
		}
		again, err := decodeRequest(r.encode(nil))
		if err != nil || again != r {
			t.Fatalf("re-encoded request differs: %+v vs %+v (%v)", again, r, err)
		}
	})
}
