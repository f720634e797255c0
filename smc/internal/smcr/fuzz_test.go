package smcr

import (
	"reflect"
	"testing"
)

// FuzzCLC feeds any bytes to the CLC decoders: none may panic, and what
// one decodes must encode to bytes that decode to the same message.
func FuzzCLC(f *testing.F) {
	for _, b := range [][]byte{kernelProposal, kernelAccept, kernelConfirm,
		(&Decline{Version: 2, Diagnosis: DeclineNoUEID, More: &[4]uint32{}}).Append(nil)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := DecodeProposal(b); err == nil {
			enc, err := p.Append(nil)
			if err != nil {
				t.Fatalf("decoded proposal %+v does not encode: %v", p, err)
			}
			again(t, p, first2(DecodeProposal(enc)))
		}
		if m, err := DecodeAcceptConfirm(b); err == nil {
			enc, err := m.Append(nil)
			if err != nil {
				t.Fatalf("decoded accept/confirm %+v does not encode: %v", m, err)
			}
			again(t, m, first2(DecodeAcceptConfirm(enc)))
		}
		if d, err := DecodeDecline(b); err == nil {
			again(t, d, first2(DecodeDecline(d.Append(nil))))
		}
	})
}

// FuzzLLC does the same for LLC and CDC messages.
func FuzzLLC(f *testing.F) {
	for _, b := range [][]byte{kernelConfirmLinkReq, kernelAddLinkReq, kernelDeleteRkeyReq, kernelCDCClosed,
		(&DeleteLink{Version: 2, Flags: LLCFlagDelLinkAll | LLCFlagDelLinkOrdly, Reason: DelLinkOpInit}).Append(nil),
		(&TestLink{Version: 2, UserData: [16]byte{1}}).Append(nil)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := DecodeLLC(b); err == nil {
			again(t, m, first2(DecodeLLC(m.Append(nil))))
		}
		if c, err := DecodeCDC(b); err == nil {
			again(t, c, first2(DecodeCDC(c.Append(nil))))
		}
	})
}

type result struct {
	v   any
	err error
}

func first2[T any](v T, err error) result { return result{v, err} }

func again(t *testing.T, want any, got result) {
	t.Helper()
	if got.err != nil {
		t.Fatalf("re-encoded %T does not decode: %v", want, got.err)
	}
	if !reflect.DeepEqual(got.v, want) {
		t.Fatalf("re-decoded %+v\nwant %+v", got.v, want)
	}
}
