package core

import (
	"reflect"
	"slices"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// fakeAH is an address handle for building work requests without a device.
type fakeAH struct{}

func (fakeAH) Dest() verbs.Endpoint { return verbs.Endpoint{} }
func (fakeAH) Close() error         { return nil }

// bytesMR stands behind an MR whose memory is b.
type bytesMR struct {
	verbs.MR
	b []byte
}

func (m bytesMR) Bytes() []byte { return m.b }

// TestOneWR: the work request oneWR writes over a used scratch slot is
// the one appendWRs builds from zero (fillWR over a slot it appends, zero)
// and the one the record asks for, for every record it takes (READ,
// WRITE, atomics, with and without a local buffer, messages in their
// header slot and behind it, on a DCI and on an RC QP), whatever the slot
// held before: a field of verbs.SendWR that oneWR forgets is caught here,
// as a stale value.
func TestOneWR(t *testing.T) {
	q := &Queue{id: 7}
	q.port.Store(3)
	tg := &target{dct: 99, key: 0xdc, ah: fakeAH{}}
	hdrMem, srcMem := make([]byte, 16*hdrSlot), make([]byte, 4096)
	hdr := &MR{mr: bytesMR{b: hdrMem}, addr: 1 << 30, lkey: 9, n: len(hdrMem), mem: hdrMem}
	src := &MR{mr: bytesMR{b: srcMem}, addr: 1 << 20, lkey: 4, n: len(srcMem), mem: srcMem}
	msg := src.Range(64, 100)
	recs := []rec{
		{op: verbs.OpRead, signaled: true, local: verbs.SGE{Addr: 4096, Length: 8, LKey: 3}, hasLocal: true, raddr: 1 << 20, rkey: 5},
		{op: verbs.OpWrite, local: verbs.SGE{Addr: 64, Length: 100, LKey: 4}, hasLocal: true, raddr: 77, rkey: 6},
		{op: verbs.OpWrite, raddr: 77, rkey: 6},
		{op: verbs.OpCompareSwap, signaled: true, local: verbs.SGE{Addr: 8, Length: 8, LKey: 1}, hasLocal: true, raddr: 8, rkey: 2, cmp: 3, swap: 4},
		{op: verbs.OpFetchAdd, local: verbs.SGE{Addr: 16, Length: 8, LKey: 1}, hasLocal: true, raddr: 24, rkey: 2, cmp: 9},
		{op: verbs.OpSend, signaled: true, local: sge(src, msg), hasLocal: true, dstPort: 8, src: src},
		{op: verbs.OpSendImm, local: sge(src, msg), hasLocal: true, dstPort: 8, src: src, imm: 0x77, msgImm: true},
		{op: verbs.OpSend, local: sge(src, src.Range(0, 4000)), hasLocal: true, dstPort: 8},
		{op: verbs.OpSend, dstPort: 8},
	}
	for _, rc := range []*peer{nil, {}} {
		for i, r := range recs {
			r.q, r.target = q, tg
			p := &pqp{rt: &Runtime{node: 5}, rc: rc, depth: 16, mask: 15, hdr: hdr, wrs: make([]verbs.SendWR, 0, 16), sges: make([]verbs.SGE, 0, 32)}
			want := p.appendWRs(nil, &r, 1234, true)
			want[0].SGL = slices.Clone(want[0].SGL) // the scratch SGEs are written again below
			p.wrs = p.wrs[:1]
			fillAll(reflect.ValueOf(&p.wrs[0]).Elem())
			p.sges = append(p.sges[:0], verbs.SGE{Addr: 1, Length: 2, LKey: 3}, verbs.SGE{Addr: 4, Length: 5, LKey: 6})
			p.sinceSignal = 3
			p.oneWR(&r, 1234)
			for _, w := range [][]verbs.SendWR{p.wrs, want} {
				if len(w[0].SGL) == 0 {
					w[0].SGL = nil // empty either way
				}
			}
			asked := verbs.SendWR{ID: 7<<32 | 1234, Op: r.op, Flags: verbs.Signaled, RemoteAddr: r.raddr, RKey: r.rkey, CompareAdd: r.cmp, Swap: r.swap}
			if rc == nil {
				asked.AH, asked.RemoteQPN, asked.DCKey = tg.ah, tg.dct, tg.key
			}
			switch {
			case r.op.IsSend():
				asked.Op, asked.Imm = verbs.OpSendImm, r.dstPort
				if r.msgImm {
					asked.Imm |= portHasImm
				}
				slot := p.slot(1234) * hdrSlot
				if r.src != nil {
					asked.SGL = []verbs.SGE{sge(hdr, hdr.Range(slot, hdrLen+int(r.local.Length)))}
				} else {
					asked.SGL = []verbs.SGE{sge(hdr, hdr.Range(slot, hdrLen))}
					if r.hasLocal {
						asked.SGL = append(asked.SGL, r.local)
					}
				}
			case r.hasLocal:
				asked.SGL = []verbs.SGE{r.local}
			}
			if len(want) != 1 || !reflect.DeepEqual(want[0], asked) {
				t.Errorf("record %d (rc %v): appendWRs %+v, want %+v", i, rc != nil, want, asked)
			}
			if !reflect.DeepEqual(p.wrs, want) {
				t.Errorf("record %d (rc %v): oneWR %+v, appendWRs %+v", i, rc != nil, p.wrs, want)
			}
			if p.sinceSignal != 0 {
				t.Errorf("record %d: sinceSignal %d after a signaled request", i, p.sinceSignal)
			}
		}
	}
}

// fillAll sets every field of v (a struct) to a value that is not zero.
func fillAll(v reflect.Value) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Int, reflect.Int32, reflect.Int64:
			if f.CanUint() {
				f.SetUint(0xab)
			} else {
				f.SetInt(0xab)
			}
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Interface:
			f.Set(reflect.ValueOf(fakeAH{}))
		default:
			panic("fillAll: field " + v.Type().Field(i).Name + " of kind " + f.Kind().String())
		}
	}
}
