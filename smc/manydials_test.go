package smc_test

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/smc"
)

// TestManyDialsAtOnce: many clients dial one server at once, the first
// connections of two fresh Nodes (each making the queue and the slabs
// while the others wait or race for them): every one runs over SMC and
// echoes its own bytes back whole, once; every dial, echo and Close
// returns within a bound, and both Nodes end with no connection open.
func TestManyDialsAtOnce(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode, cliNode := open(t, srvAPI, smc.NodeOptions{}), open(t, api, smc.NodeOptions{})
			// A handshake as long as the test's bound: the dials are to
			// run over SMC however loaded the machine.
			ln := listen(t, &smc.Options{Node: srvNode, HandshakeTimeout: 20 * time.Second})
			const dials = 24
			echoes := serveEchoes(ln, dials)
			errs := make(chan error, dials)
			var wg sync.WaitGroup
			for i := range dials {
				wg.Go(func() {
					errs <- dialManyEcho(t, ln.Addr().String(), &smc.Options{Node: cliNode, HandshakeTimeout: 20 * time.Second}, i)
				})
			}
			bounded.Within(t, 30*time.Second, "the dials", func() error { wg.Wait(); return nil })
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			bounded.Within(t, 10*time.Second, "the server's echoes", echoes)
			for side, n := range map[string]*smc.Node{"server": srvNode, "client": cliNode} {
				if open := len(n.Conns()); open != 0 {
					t.Errorf("%s: %d connections open after every one closed", side, open)
				}
			}
		})
	}
}

// dialManyEcho dials addr, writes a payload of its own, closes its writing
// side and checks that the echo is the payload, whole.
func dialManyEcho(t *testing.T, addr string, opts *smc.Options, i int) error {
	c, err := smc.DialContext(ctxT(t), "tcp", addr, opts)
	if err != nil {
		return fmt.Errorf("dial %d: %w", i, err)
	}
	defer c.Close()
	if m := smc.ModeOf(c); !m.SMC {
		return fmt.Errorf("dial %d: mode %v", i, m)
	}
	want := bytes.Repeat(fmt.Appendf(nil, "dial %d;", i), 100+i*50)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	werr := make(chan error, 1)
	go func() { // ends with the write or the deadline
		_, err := c.Write(want)
		if err == nil {
			err = c.(*smc.Conn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err2 := <-werr; err == nil {
		err = err2
	}
	switch {
	case err != nil:
		return fmt.Errorf("dial %d: echo: %w after %d bytes", i, err, len(got))
	case !bytes.Equal(got, want):
		return fmt.Errorf("dial %d: echo of %d bytes read as %d, equal %v", i, len(want), len(got), bytes.Equal(got, want))
	}
	return nil
}
