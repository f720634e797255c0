package verbs_test

import (
	"errors"
	"testing"

	"github.com/krcore/krcore/verbs"
)

func TestEndpointRejects(t *testing.T) {
	var e verbs.Endpoint
	for _, b := range [][]byte{nil, {9}, make([]byte, 28), append([]byte{1}, make([]byte, 27)...)[:27]} {
		if err := e.UnmarshalBinary(b); !errors.Is(err, verbs.ErrBadEndpoint) {
			t.Errorf("UnmarshalBinary(%x): %v", b, err)
		}
	}
	long := verbs.Endpoint{Addr: string(make([]byte, 300))}
	if _, err := long.MarshalBinary(); !errors.Is(err, verbs.ErrBadEndpoint) {
		t.Errorf("300-byte address marshalled: %v", err)
	}
	for _, s := range []string{"qpn", "qpn=x", "gid=zz", "lid=99999", "color=red"} {
		if _, err := verbs.ParseEndpoint(s); !errors.Is(err, verbs.ErrBadEndpoint) {
			t.Errorf("ParseEndpoint(%q): %v", s, err)
		}
	}
}

func TestStatusNames(t *testing.T) {
	for s := verbs.Success; s <= verbs.GeneralErr; s++ {
		back, err := verbs.ParseStatus(s.String())
		if err != nil || back != s {
			t.Errorf("status %d: %q -> %v %v", s, s, back, err)
		}
	}
	if verbs.RemAccessErr.String() != "REM_ACCESS_ERR" || verbs.WRFlushErr.String() != "WR_FLUSH_ERR" || verbs.RetryExcErr.String() != "RETRY_EXC_ERR" {
		t.Error("status names differ from libibverbs'")
	}
	wc := verbs.WC{ID: 7, Status: verbs.RemAccessErr}
	if !errors.Is(wc.Err(), verbs.RemAccessErr) {
		t.Error("a failed completion's error does not match its status")
	}
}

func TestTransportOpcodes(t *testing.T) {
	if verbs.UD.Supports(verbs.OpRead) || verbs.UC.Supports(verbs.OpFetchAdd) || !verbs.DCI.Supports(verbs.OpCompareSwap) {
		t.Error("opcode support per transport differs from hardware's")
	}
}
