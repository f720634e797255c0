package smcr

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

// What Linux 6.12 (Debian's 6.12.117+deb12) put on the wire between two
// AF_SMC sockets over soft-RoCE, captured by .ci/smc-vm.sh with
// KSMC_CAPTURE (tcpdump on vethA): the first connection of a new link
// group, client 10.1.0.2, server 10.1.0.1, UEID "KRCORE-SMC-CI",
// net.smc.smcr_max_links_per_lgr=2. CLC messages are whole TCP payloads;
// LLC and CDC messages are the payloads of RoCEv2 SEND_ONLY packets (BTH
// and ICRC removed). The close-time CDC and DELETE_RKEY come from a second
// capture of the same scenario with a 64 KiB echo.
var (
	kernelProposal = mustHex("e2d4c3d901009c22000000000000000000000000000000000000000000000000000000000000000000000000000000000000001c00000000000000000000000000000000000000000000000000000000010000100000000000000000000000000000ffff0a010002ff0200010000000000000000000000004b52434f52452d534d432d434920202020202020202020202020202020202020e2d4c3d9")
	kernelAccept   = mustHex("e2d4c3d90200a028355d0a8151176d6e00000000000000000000ffff0a01000152df173fc186000011000003f001000000012300ffff8880084200000045359f4b52434f52452d534d432d434920202020202020202020202020202020202020000000000000000080210000286e6f6e65292020202020202020202020202020202020202020202020202020ff020001000000000000000000000000e2d4c3d9")
	kernelConfirm  = mustHex("e2d4c3d90300c428355d0a8151176d6e00000000000000000000ffff0a0100024e09bba5e641000011000003a001000000022300ffff88800844000000bc6e5f4b52434f52452d534d432d434920202020202020202020202020202020202020000000000000000080210000286e6f6e65292020202020202020202020202020202020202020202020202020ff0200010000000000000000000000000200000000000000000000000000ffff0a01000200000000000000000000ffff0a010001e2d4c3d9")

	kernelConfirmLinkReq  = mustHex("212c000352df173fc18600000000000000000000ffff0a010001000011010000010102ff0000000000000000")
	kernelConfirmLinkResp = mustHex("212c00834e09bba5e64100000000000000000000ffff0a010002000011010000020102ff0000000000000000")
	kernelAddLinkReq      = mustHex("225800004e09bba5e641000000000000000000000000ffff0a010002000012020300e08f0000000000000000800000000000000000000000ffff0a01000200000000000000000100000003f00000050effff888008420000")
	kernelAddLinkResp     = mustHex("2258008052df173fc186000000000000000000000000ffff0a01000100001202034177d30000000000000000800000000000000000000000ffff0a01000100000000000000000100000003a00000056affff888008440000")
	kernelDeleteRkeyReq   = mustHex("292c000001000000000003230000000000000000000000000000000000000000000000000000000000000000")
	kernelDeleteRkeyResp  = mustHex("292c008001000000000000000000000000000000000000000000000000000000000000000000000000000000")

	kernelCDCFirstWrite = mustHex("fe2c000100000001000000010000000000000000000000008000000000000000000000000000000000000000")
	kernelCDCAck        = mustHex("fe2c000100000002000000000000000000000001000000000000000000000000000000000000000000000000")
	kernelCDCClosed     = mustHex("fe2c00170000000200000001000000a000000001000000a00040000000000000000000000000000000000000")
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func gid4(a, b, c, d byte) [16]byte {
	return [16]byte{10: 0xff, 11: 0xff, 12: a, 13: b, 14: c, 15: d}
}

func TestKernelProposal(t *testing.T) {
	p, err := DecodeProposal(kernelProposal)
	if err != nil {
		t.Fatal(err)
	}
	want := &Proposal{
		Eyecatcher: EyecatcherR, Version: 2, TypeV1: SMCTypeN, TypeV2: SMCTypeR,
		V2: &V2Extension{Release: 1, RoCEGID: gid4(10, 1, 0, 2), MaxConns: 255, MaxLinks: 2,
			FeatureMask: 1, EIDs: []EID{MakeEID("KRCORE-SMC-CI")}},
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("decoded %+v\nwant %+v", p, want)
	}
	roundTrip(t, kernelProposal, func(b []byte) ([]byte, error) { return p.Append(b) })
}

func TestKernelAcceptConfirm(t *testing.T) {
	a, err := DecodeAcceptConfirm(kernelAccept)
	if err != nil {
		t.Fatal(err)
	}
	host := [32]byte(bytes.Repeat([]byte(" "), 32))
	copy(host[:], "(none)")
	fce := &FirstContactExt{V2Direct: true, OSType: OSLinux, Release: 1, Hostname: host,
		MaxConns: 255, MaxLinks: 2, FeatureMask: 1}
	want := &AcceptConfirm{
		Type: TypeAccept, Version: 2, FirstContact: true,
		PeerID: [8]byte(mustHex("355d0a8151176d6e")), GID: gid4(10, 1, 0, 1),
		MAC: [6]byte(mustHex("52df173fc186")), QPN: 17, RMBRkey: 0x3f0, RMBEIdx: 1, AlertToken: 1,
		RMBESize: 2, QPMTU: 3, RMBAddr: 0xffff888008420000, PSN: 0x45359f,
		EID: MakeEID("KRCORE-SMC-CI"), FCE: fce,
	}
	if !reflect.DeepEqual(a, want) {
		t.Fatalf("accept %+v\nwant %+v", a, want)
	}
	roundTrip(t, kernelAccept, func(b []byte) ([]byte, error) { return a.Append(b) })

	c, err := DecodeAcceptConfirm(kernelConfirm)
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != TypeConfirm || c.QPN != 17 || c.RMBRkey != 0x3a0 || c.AlertToken != 2 ||
		c.PSN != 0xbc6e5f || !reflect.DeepEqual(c.FCE, fce) ||
		!reflect.DeepEqual(c.GIDs, [][16]byte{gid4(10, 1, 0, 2), gid4(10, 1, 0, 1)}) {
		t.Fatalf("confirm %+v", c)
	}
	roundTrip(t, kernelConfirm, func(b []byte) ([]byte, error) { return c.Append(b) })
}

func TestKernelLLC(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want LLCMessage
	}{
		{"CONFIRM_LINK request", kernelConfirmLinkReq, &ConfirmLink{Version: 2, Flags: LLCFlagNoRMBEEyeC,
			SenderMAC: [6]byte(mustHex("52df173fc186")), SenderGID: gid4(10, 1, 0, 1), SenderQPN: 17,
			LinkNum: 1, LinkUID: [4]byte{0, 0, 1, 1}, MaxLinks: 2, MaxConns: 255}},
		{"CONFIRM_LINK response", kernelConfirmLinkResp, nil},
		{"ADD_LINK request", kernelAddLinkReq, &AddLink{Version: 2,
			SenderMAC: [6]byte(mustHex("4e09bba5e641")), SenderGID: gid4(10, 1, 0, 2), SenderQPN: 18,
			LinkNum: 2, QPMTU: 3, InitialPSN: 0xe08f,
			V2: &AddLinkV2{V2Direct: true, ClientTargetGID: gid4(10, 1, 0, 2),
				Rkeys: []AddLinkRkey{{RMBKey: 0x3f0, RMBKeyNew: 0x50e, RMBVaddr: 0xffff888008420000}}}}},
		{"ADD_LINK response", kernelAddLinkResp, nil},
		{"DELETE_RKEY request", kernelDeleteRkeyReq, &DeleteRkey{Version: 2, Rkeys: []uint32{0x323}}},
		{"DELETE_RKEY response", kernelDeleteRkeyResp, &DeleteRkey{Version: 2, Flags: LLCFlagResp, Rkeys: []uint32{0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeLLC(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != nil && !reflect.DeepEqual(m, tc.want) {
				t.Fatalf("decoded %+v\nwant %+v", m, tc.want)
			}
			roundTrip(t, tc.b, func(b []byte) ([]byte, error) { return m.Append(b), nil })
		})
	}
}

func TestKernelCDC(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want CDC
	}{
		// 64 KiB written: the producer cursor wrapped once.
		{kernelCDCFirstWrite, CDC{Seq: 1, Token: 1, Prod: Cursor{Wrap: 1}, ProdFlags: CDCWriteBlocked}},
		{kernelCDCAck, CDC{Seq: 1, Token: 2, Cons: Cursor{Wrap: 1}}},
		{kernelCDCClosed, CDC{Seq: 0x17, Token: 2, Prod: Cursor{1, 0xa0}, Cons: Cursor{1, 0xa0}, ConnFlags: CDCPeerConnClosed}},
	} {
		m, err := DecodeCDC(tc.b)
		if err != nil {
			t.Fatal(err)
		}
		if *m != tc.want {
			t.Fatalf("decoded %+v, want %+v", *m, tc.want)
		}
		roundTrip(t, tc.b, func(b []byte) ([]byte, error) { return m.Append(b), nil })
	}
}

// roundTrip checks that encoding what was decoded from want gives want,
// appended after a prefix that must stay untouched.
func roundTrip(t *testing.T, want []byte, enc func([]byte) ([]byte, error)) {
	t.Helper()
	got, err := enc([]byte("prefix"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got[:6]) != "prefix" || !bytes.Equal(got[6:], want) {
		t.Fatalf("re-encoded\n%x\nwant\n%x", got[6:], want)
	}
}

func TestDecline(t *testing.T) {
	for _, d := range []*Decline{
		{Version: 1, Diagnosis: DeclinePeerNoSMC},
		{Version: 2, PeerID: [8]byte{1, 2, 3}, Diagnosis: DeclineNoUEID, OSType: OSLinux, More: &[4]uint32{DeclineNoSMCRDev}},
		{Version: 2, OutOfSync: true, Diagnosis: DeclineSyncErr, OSType: OSLinux, More: &[4]uint32{}},
	} {
		b := d.Append(nil)
		if want := map[bool]int{false: declineV1Len, true: declineV2Len}[d.More != nil]; len(b) != want {
			t.Fatalf("decline %+v: %d bytes, want %d", d, len(b), want)
		}
		got, err := DecodeDecline(b)
		if err != nil {
			t.Fatal(err)
		}
		d.Eyecatcher = EyecatcherR
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("decoded %+v, want %+v", got, d)
		}
	}
	if DeclineName(DeclinePeerNoSMC) != "PEERNOSMC" || DeclineName(7) != "0x00000007" {
		t.Fatal("DeclineName")
	}
}

// TestProposalAreas covers what the kernel's capture does not: a version 1
// prefix area with IPv6 prefixes before the v2 extension, and SMC-Dv2.
func TestProposalAreas(t *testing.T) {
	p := &Proposal{
		Eyecatcher: EyecatcherR, Version: 2, TypeV1: SMCTypeR, TypeV2: SMCTypeB,
		PeerID: [8]byte{9}, GID: gid4(10, 0, 0, 1), MAC: [6]byte{2}, ISMGID: 7, ISMCHID: 8,
		Prefix: &IPPrefix{Subnet: [4]byte{10, 0, 0, 0}, Len: 24, V6: []IPv6Prefix{{Prefix: [16]byte{0xfd}, Len: 64}}},
		V2: &V2Extension{Release: 1, SEID: true, RoCEGID: gid4(10, 0, 0, 1), MaxConns: 255, MaxLinks: 2,
			EIDs: []EID{MakeEID("A"), MakeEID("B")},
			SMCD: &SMCDv2Extension{SystemEID: MakeEID("SYS"), GIDCHIDs: []GIDCHID{{GID: 5, CHID: 6}}}},
	}
	b, err := p.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeProposal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("decoded %+v\nwant %+v", got, p)
	}
	p.Prefix = nil
	if _, err := p.Append(nil); err == nil {
		t.Fatal("a v1-offering proposal without its prefix area encoded")
	}
}

func TestMalformed(t *testing.T) {
	cut := func(b []byte, n int) []byte { return append([]byte(nil), b[:len(b)-n]...) }
	bad := func(b []byte, i int, v byte) []byte { c := append([]byte(nil), b...); c[i] = v; return c }
	for name, err := range map[string]error{
		"short":             first(DecodeProposal(kernelProposal[:20])),
		"cut":               first(DecodeProposal(cut(kernelProposal, 1))),
		"trailer":           first(DecodeProposal(bad(kernelProposal, len(kernelProposal)-1, 0))),
		"eid count":         first(DecodeProposal(bad(kernelProposal, 80, 9))),
		"v2 offset":         first(DecodeProposal(bad(kernelProposal, 51, 0xf0))),
		"accept type":       first(DecodeAcceptConfirm(kernelProposal)),
		"confirm gid count": first(DecodeAcceptConfirm(bad(kernelConfirm, 156, 5))),
		"llc length":        first(DecodeLLC(cut(kernelConfirmLinkReq, 1))),
		"add link rkeys":    first(DecodeLLC(bad(kernelAddLinkReq, 71, 2))),
		"cdc":               first(DecodeCDC(kernelConfirmLinkReq)),
	} {
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	smcd := bad(kernelAccept, 7, 0x29)
	if _, err := DecodeAcceptConfirm(smcd); !errors.Is(err, ErrUnsupported) {
		t.Errorf("SMC-D accept: %v, want ErrUnsupported", err)
	}
}

func first[T any](_ T, err error) error { return err }

func TestReadCLC(t *testing.T) {
	r := bytes.NewReader(append(append([]byte(nil), kernelProposal...), kernelConfirm...))
	for _, want := range [][]byte{kernelProposal, kernelConfirm} {
		got, err := ReadCLC(r)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("ReadCLC: %x, %v", got, err)
		}
	}
	if _, err := ReadCLC(bytes.NewReader([]byte("GET / HTTP/1.1\r\n"))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("ReadCLC of HTTP: %v", err)
	}
}
