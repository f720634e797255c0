package smc_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/krcore/krcore/smc"
)

// copyThrough copies n random bytes into w with io.Copy (w's ReadFrom:
// the source has no WriteTo), half-closes w,
// and copies r into a buffer with io.Copy (r's WriteTo); every byte must
// arrive in order.
func copyThrough(t *testing.T, w, r net.Conn, n int) {
	t.Helper()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	errc := make(chan error, 1)
	go func() {
		k, err := io.Copy(w, io.LimitReader(bytes.NewReader(want), int64(n)))
		if err == nil && k != int64(n) {
			err = io.ErrShortWrite
		}
		if err == nil {
			err = w.(*smc.Conn).CloseWrite()
		}
		errc <- err
	}()
	var got bytes.Buffer
	if _, err := io.Copy(&got, r); err != nil {
		t.Fatalf("WriteTo: %v after %d bytes", err, got.Len())
	}
	if err := <-errc; err != nil {
		t.Fatalf("copy in: %v", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("read %d bytes, want %d; equal %v", got.Len(), n, bytes.Equal(got.Bytes(), want))
	}
}

// TestCopy: io.Copy into a connection (its ReadFrom) and out of one (its
// WriteTo) carries a stream larger than the buffers, over SMC both ways
// (embedded and through krcored) and over a fallen-back connection.
func TestCopy(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
			cliNode := open(t, api, smc.NodeOptions{BufferSize: 16 << 10})
			ln := listen(t, &smc.Options{Node: srvNode})
			s, c := pair(t, ln, &smc.Options{Node: cliNode})
			if m := settled(t, s); !m.SMC {
				t.Fatalf("server mode %v, want SMC", m)
			}
			copyThrough(t, c, s, 1<<20+7)
			copyThrough(t, s, c, 300<<10)
		})
	}
	t.Run("fallback", func(t *testing.T) {
		ln := listen(t, &smc.Options{Node: open(t, srvAPI, smc.NodeOptions{})})
		s, c := pair(t, ln, &smc.Options{}) // no Node: plain TCP
		copyThrough(t, c, s, 1<<20+7)
		copyThrough(t, s, c, 300<<10)
	})
}

// BenchmarkCopyIn: io.Copy of 4 MiB into an SMC connection through its
// ReadFrom, against io.CopyBuffer with io.Copy's 32 KiB buffer (the
// connection's Write alone); the peer discards what arrives.
func BenchmarkCopyIn(b *testing.B) {
	srvAPI, clients := apis(b)
	srvNode := open(b, srvAPI, smc.NodeOptions{})
	cliNode := open(b, clients["embedded"], smc.NodeOptions{})
	ln := listen(b, &smc.Options{Node: srvNode})
	s, c := pair(b, ln, &smc.Options{Node: cliNode})
	go io.Copy(io.Discard, s)
	src := make([]byte, 4<<20)
	for range 4 { // the receive buffer grows to its maximum first
		if _, err := c.Write(src); err != nil {
			b.Fatal(err)
		}
	}
	for _, bench := range []struct {
		name   string
		copyIn func() (int64, error)
	}{
		{"ReadFrom", func() (int64, error) { return io.Copy(c, io.LimitReader(bytes.NewReader(src), int64(len(src)))) }},
		{"Write32K", func() (int64, error) {
			return io.CopyBuffer(struct{ io.Writer }{c}, io.LimitReader(bytes.NewReader(src), int64(len(src))), make([]byte, 32<<10))
		}},
	} {
		copyIn := bench.copyIn
		b.Run(bench.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if _, err := copyIn(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
