package conformance

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// testSubRegistration: memory registered a second time over a part of it
// with fewer rights (how a runtime grants exactly an exported range) gives
// the second rkey exactly that part with exactly those rights: the target
// refuses anything else with REM_ACCESS_ERR and touches no byte, while the
// first registration keeps working, also after the second is closed.
func testSubRegistration(t *testing.T, e *env) {
	const off, n = 1024, 1024
	whole := e.b.mr(regionSize, verbs.AccessAll)
	fill(whole.mem, 0x31)
	sub, err := e.b.pd.RegMR(whole.mem[off:off+n], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatalf("register [%d,+%d) of a registered buffer again: %v", off, n, err)
	}
	closeLater(t, "sub-registration", sub)
	part := region{MR: sub, mem: whole.mem[off : off+n]}
	l := e.a.mr(regionSize, verbs.AccessAll)
	before := bytes.Clone(whole.mem)

	p := e.rc(rcOpts{})
	post(t, p.qa, readWR(1, l.sge(0, 64), part, n-64))
	wantOK(t, e.wc(p.ca), 1, verbs.WCRead, p.qa)
	if !bytes.Equal(l.mem[:64], whole.mem[off+n-64:off+n]) {
		t.Error("READ through the second registration returned the wrong bytes")
	}
	bad := map[string]verbs.SendWR{
		"READ across its end":        readWR(2, l.sge(0, 64), part, n-32),
		"READ before its start":      func() verbs.SendWR { w := readWR(2, l.sge(0, 64), part, 0); w.RemoteAddr = whole.at(0); return w }(),
		"WRITE without REMOTE_WRITE": writeWR(2, l.sge(0, 64), part, 0),
		"READ of the first's last byte": func() verbs.SendWR {
			w := readWR(2, l.sge(0, 8), part, 0)
			w.RemoteAddr = whole.at(regionSize - 8)
			return w
		}(),
	}
	for what, wr := range bad {
		p := e.rc(rcOpts{})
		clear(l.mem)
		post(t, p.qa, wr)
		if wc := e.wc(p.ca); wc.Status != verbs.RemAccessErr {
			t.Errorf("%s with the second rkey: %s, want REM_ACCESS_ERR", what, wc.Status)
		}
		if !bytes.Equal(l.mem, make([]byte, regionSize)) {
			t.Errorf("%s with the second rkey: bytes landed", what)
		}
	}
	if !bytes.Equal(whole.mem, before) {
		t.Error("refused requests changed the memory")
	}
	if err := sub.Close(); err != nil {
		t.Fatalf("close the second registration: %v", err)
	}
	p = e.rc(rcOpts{})
	post(t, p.qa, writeWR(3, l.sge(0, 64), whole, off))
	wantOK(t, e.wc(p.ca), 3, verbs.WCWrite, p.qa)
}
