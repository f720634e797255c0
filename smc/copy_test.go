package smc_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/krcore/krcore/smc"
)

// copyThrough copies n random bytes into w with io.Copy, half-closes w,
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

// TestCopy: io.Copy out of a connection (its WriteTo) carries a stream larger than the buffers, over SMC both ways
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
