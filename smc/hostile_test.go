package smc_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/smc"
)

// TestOptionsBufferSizeHostile: Options.BufferSize out of its range is
// refused by Listen and Dial; an odd size in range works both ways; one
// past the Node's memory bound falls back rather than hangs.
func TestOptionsBufferSizeHostile(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{})
	for _, size := range []int{-1, 1, smc.MinBufferSize - 1, 1<<30 + 1, -1 << 40} {
		if _, err := smc.Listen("tcp", "127.0.0.1:0", &smc.Options{Node: srvNode, BufferSize: size}); !errors.Is(err, krcore.ErrInvalid) {
			t.Errorf("Listen with BufferSize %d: %v, want ErrInvalid", size, err)
		}
		if _, err := smc.DialContext(ctxT(t), "tcp", "127.0.0.1:1", &smc.Options{Node: cliNode, BufferSize: size}); !errors.Is(err, krcore.ErrInvalid) {
			t.Errorf("Dial with BufferSize %d: %v, want ErrInvalid", size, err)
		}
	}
	odd := smc.MinBufferSize + 12345
	ln := listen(t, &smc.Options{Node: srvNode, BufferSize: odd})
	s, c := pair(t, ln, &smc.Options{Node: cliNode, BufferSize: odd + 7})
	if m := settled(t, s); !m.SMC {
		t.Fatalf("odd sizes: server mode %v, want SMC", m)
	}
	transfer(t, c, s, 1<<20)
	transfer(t, s, c, 1<<20)

	huge := listen(t, &smc.Options{Node: srvNode, BufferSize: 1 << 30})
	s2, c2 := pair(t, huge, &smc.Options{Node: cliNode})
	m := settled(t, s2)
	t.Logf("1 GiB buffer on a 256 MiB Node: %v", m)
	transfer(t, c2, s2, 64<<10)
}

// TestNodeOptionsBufferSizeHostile: NodeOptions.BufferSize out of the
// range Options.BufferSize takes (MinBufferSize to 1 GiB) and a
// MaxBufferSize below the adapting start are refused by Open with
// ErrInvalid, as are negative bounds; the range's ends are taken.
func TestNodeOptionsBufferSizeHostile(t *testing.T) {
	srvAPI, _ := apis(t)
	for _, o := range []smc.NodeOptions{
		{BufferSize: -1}, {BufferSize: 1}, {BufferSize: 64}, {BufferSize: smc.MinBufferSize - 1},
		{BufferSize: 1<<30 + 1}, {BufferSize: -1 << 40}, {MaxBufferSize: -1},
		{MaxBufferSize: smc.DefaultBufferSize - 1}, {MaxBufferSize: 1<<30 + 1}, {MaxMemory: -1},
	} {
		if n, err := smc.Open(srvAPI, o); !errors.Is(err, krcore.ErrInvalid) {
			if err == nil {
				n.Close()
			}
			t.Errorf("Open with %+v: %v, want ErrInvalid", o, err)
		}
	}
	for _, o := range []smc.NodeOptions{{BufferSize: smc.MinBufferSize}, {BufferSize: 1 << 30}} {
		open(t, srvAPI, o)
	}
}

// TestNodeCloseWhilePopping: a Read waiting (popping the Node's port)
// ends when its Node closes, and Close twice mid-wait is harmless.
func TestNodeCloseWhilePopping(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode, err := smc.Open(srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: 16 << 10})
	ln := listen(t, &smc.Options{Node: srvNode})
	var ss []net.Conn
	for range 3 {
		s, _ := pair(t, ln, &smc.Options{Node: cliNode})
		if m := settled(t, s); !m.SMC {
			t.Fatalf("server mode %v, want SMC", m)
		}
		ss = append(ss, s)
	}
	errc := make(chan error, len(ss))
	for _, s := range ss {
		go func() {
			var b [1]byte
			_, err := s.Read(b[:])
			errc <- err
		}()
	}
	time.Sleep(20 * time.Millisecond)
	ss[0].Close()
	ss[0].Close()
	done := make(chan struct{})
	go func() { srvNode.Close(); srvNode.Close(); close(done) }()
	for range ss {
		select {
		case err := <-errc:
			t.Logf("read: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("a Read waiting on a closed Node's connection hangs")
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Node.Close hangs")
	}
}

// TestCloseWhileWriterWaits: a Write waiting for window (it may pop the
// Node's port) ends when its connection closes, with a reader of the
// same Node waiting beside it.
func TestCloseWhileWriterWaits(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: 16 << 10})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode, BufferSize: smc.MinBufferSize})
	_, c2 := pair(t, ln, &smc.Options{Node: cliNode})
	if m := settled(t, s); !m.SMC {
		t.Fatalf("server mode %v, want SMC", m)
	}
	rc := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := c2.Read(b[:])
		rc <- err
	}()
	wc := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 4<<20))
		wc <- err
	}()
	time.Sleep(30 * time.Millisecond)
	c.Close()
	select {
	case err := <-wc:
		t.Logf("write: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a Write waiting for window hangs past Close")
	}
	c2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	select {
	case err := <-rc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read beside: %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Read beside hangs past its deadline")
	}
}

// TestFixedAgainstAdapting: a connection with a fixed BufferSize keeps its
// receive buffer while its adapting peer's grows under a stream the fixed
// side writes; every byte arrives both ways.
func TestFixedAgainstAdapting(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{MaxBufferSize: 1 << 20})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{MaxBufferSize: 1 << 20})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode, BufferSize: smc.MinBufferSize})
	if m := settled(t, s); !m.SMC {
		t.Fatalf("server mode %v, want SMC", m)
	}
	transfer(t, c, s, 16<<20)
	if g := cliNode.Stats().Grows; g != 0 {
		t.Errorf("the fixed side grew its buffer %d times", g)
	}
	t.Logf("adapting side grew %d times, fixed side %d", srvNode.Stats().Grows, cliNode.Stats().Grows)
}
