package smcopt

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// synWith returns an IPv4 SYN's headers with the TCP options opts.
func synWith(opts ...byte) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	ip := make([]byte, 20)
	ip[0], ip[9] = 0x45, 6
	tcp := make([]byte, 20)
	tcp[12] = byte((20+len(opts))/4) << 4
	return append(append(ip, tcp...), opts...)
}

func TestHasOption(t *testing.T) {
	mss := []byte{2, 4, 0x05, 0xb4}
	smc := Option[:]
	other := []byte{254, 6, 0xe2, 0xd4, 0xc3, 0xc4} // another experiment ("SMCD")
	for _, tc := range []struct {
		syn  []byte
		want bool
		err  bool
	}{
		{synWith(append(append([]byte{}, mss...), smc...)...), true, false},
		{synWith(append([]byte{1, 1}, smc...)...), true, false},
		{synWith(mss...), false, false},
		{synWith(other...), false, false},
		{synWith(0, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9), false, false}, // after end of options
		{synWith(254, 40), false, true},
		{[]byte{0x45}, false, true},
	} {
		got, err := HasOption(tc.syn)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("HasOption(% x) = %v, %v", tc.syn, got, err)
		}
		if tc.err && !errors.Is(err, ErrNotTCP) {
			t.Errorf("error %v does not match ErrNotTCP", err)
		}
	}
}

func TestAssemble(t *testing.T) {
	assembleChecked(t, program(7))
	if _, err := assemble([]insn{ja("nowhere")}); err == nil {
		t.Fatal("a jump to a missing label assembled")
	}
}

func assembleChecked(t *testing.T, p []insn) {
	b, err := assemble(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 8*len(p) {
		t.Fatalf("%d bytes for %d instructions", len(b), len(p))
	}
	// Every jump lands inside the program, forward (the verifier takes no
	// back edges here).
	for i := range p {
		if p[i].target == "" {
			continue
		}
		off := int(int16(uint16(b[8*i+2]) | uint16(b[8*i+3])<<8))
		if off < 0 || i+1+off >= len(p) {
			t.Fatalf("instruction %d jumps %d", i, off)
		}
	}
}

// TestSavedSYN reads the SYN of a plain Go connection back, unprivileged:
// it carries no SMC option.
func TestSavedSYN(t *testing.T) {
	l, err := Listen(context.Background(), "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l.SetDeadline(time.Now().Add(5 * time.Second))
	s, err := l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := PeerAnnounced(s)
	if err != nil || got {
		t.Fatalf("PeerAnnounced = %v, %v; want false, nil", got, err)
	}
	if _, err := PeerAnnounced(s); err == nil {
		t.Fatal("a SYN was handed out twice")
	}
}
