package smc_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/smc"
)

// TestUrgent: an urgent byte follows the bytes written before it and
// comes before those after, is read by ReadUrgent once, and is skipped by
// reads, over SMC (embedded and through krcored) and over a fallen-back
// connection (TCP's MSG_OOB).
func TestUrgent(t *testing.T) {
	srvAPI, clients := apis(t)
	run := func(t *testing.T, srv, cli *smc.Options, wantSMC bool) {
		s, c := pair(t, listen(t, srv), cli)
		if b, ok, err := s.(*smc.Conn).ReadUrgent(); ok || err != nil {
			t.Fatalf("ReadUrgent before any: %q, %v, %v", b, ok, err)
		}
		cc := c.(*smc.Conn)
		for _, step := range []func() error{
			func() error { _, err := c.Write([]byte("abc")); return err },
			func() error { return cc.WriteUrgent('!') },
			func() error { _, err := c.Write([]byte("def")); return err },
			cc.CloseWrite,
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		if m := settled(t, s); m.SMC != wantSMC { // a plain client's first bytes settle it
			t.Fatalf("mode %v", m)
		}
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
		head := make([]byte, 3)
		if _, err := io.ReadFull(s, head); err != nil || string(head) != "abc" {
			t.Fatalf("read %q, %v; want \"abc\"", head, err)
		}
		// At the mark: the urgent byte is there or on its way.
		var b byte
		var ok bool
		var err error
		for end := time.Now().Add(5 * time.Second); !ok && err == nil && time.Now().Before(end); {
			if b, ok, err = s.(*smc.Conn).ReadUrgent(); !ok {
				time.Sleep(time.Millisecond)
			}
		}
		if b != '!' || !ok || err != nil {
			t.Fatalf("ReadUrgent: %q, %v, %v; want '!'", b, ok, err)
		}
		if b, ok, err := s.(*smc.Conn).ReadUrgent(); ok || err != nil {
			t.Fatalf("ReadUrgent again: %q, %v, %v; want none", b, ok, err)
		}
		rest, err := io.ReadAll(s)
		if err != nil || string(rest) != "def" {
			t.Fatalf("read %q, %v; want \"def\" (the urgent byte out of band)", rest, err)
		}
	}
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
			cliNode := open(t, api, smc.NodeOptions{BufferSize: 16 << 10})
			run(t, &smc.Options{Node: srvNode}, &smc.Options{Node: cliNode}, true)
		})
	}
	t.Run("fallback", func(t *testing.T) {
		run(t, &smc.Options{}, &smc.Options{}, false)
	})
}

var _ net.Conn = (*smc.Conn)(nil)
