package core

import (
	"errors"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// fakeMR is an MR for the pure checks: only length, access and liveness
// matter to them.
type fakeVerbsMR struct{ verbs.MR }

func (fakeVerbsMR) Len() int { return 4096 }

func TestCheck(t *testing.T) {
	rw := &MR{mr: fakeVerbsMR{}, access: verbs.AccessAll}
	ro := &MR{mr: fakeVerbsMR{}, access: 0}
	dead := &MR{mr: fakeVerbsMR{}, access: verbs.AccessAll}
	dead.dead.Store(true)
	g := &Region{Name: "r", Len: 1024, Addr: 1 << 20, Access: verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}
	lim := limits{maxMsg: 1 << 20}
	ok := Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(0)}
	if r := check(&ok, false, lim); r != nil {
		t.Fatalf("good READ refused: %v", r)
	}
	cases := []struct {
		name string
		req  Request
		two  bool
		want verbs.Status
	}{
		{"unknown opcode", Request{Op: 99}, false, verbs.LocQPOpErr},
		{"local past MR end", Request{Op: verbs.OpRead, Local: rw.Range(4000, 200), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"negative offset", Request{Op: verbs.OpWrite, Local: rw.Range(-1, 8), Remote: g.At(0)}, false, verbs.LocLenErr},
		{"READ into read-only MR", Request{Op: verbs.OpRead, Local: ro.Range(0, 8), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"deregistered MR", Request{Op: verbs.OpWrite, Local: dead.Range(0, 8), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"no MR", Request{Op: verbs.OpWrite, Local: Local{Len: 8}, Remote: g.At(0)}, false, verbs.LocProtErr},
		{"too long", Request{Op: verbs.OpWrite, Local: Local{MR: rw, Len: 2 << 20}, Remote: g.At(0)}, false, verbs.LocLenErr},
		{"remote past region", Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(1000)}, false, verbs.RemAccessErr},
		{"remote offset overflow", Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(^uint64(0))}, false, verbs.RemAccessErr},
		{"WRITE to read-only region", Request{Op: verbs.OpWrite, Local: rw.Range(0, 8), Remote: g.At(0)}, false, verbs.RemAccessErr},
		{"no region", Request{Op: verbs.OpRead, Local: rw.Range(0, 8)}, false, verbs.RemInvReqErr},
		{"misaligned atomic", Request{Op: verbs.OpFetchAdd, Local: rw.Range(0, 8), Remote: g.At(4)}, false, verbs.RemInvReqErr},
		{"atomic of 4 bytes", Request{Op: verbs.OpFetchAdd, Local: rw.Range(0, 4), Remote: g.At(0)}, false, verbs.LocLenErr},
		{"SEND without a port", Request{Op: verbs.OpSend, Local: rw.Range(0, 8)}, false, verbs.LocQPOpErr},
	}
	for _, c := range cases {
		r := check(&c.req, c.two, lim)
		if r == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if r.status != c.want || !errors.Is(r, ErrRefused) || !errors.Is(r, c.want) {
			t.Errorf("%s: refused with %v, want %s", c.name, r, c.want)
		}
	}
	send := Request{Op: verbs.OpSend, Local: rw.Range(0, 8)}
	if r := check(&send, true, lim); r != nil {
		t.Errorf("SEND on a port refused: %v", r)
	}
}
