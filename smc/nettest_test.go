package smc_test

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/krcore/krcore/smc"
)

// TestNetConn runs golang.org/x/net/nettest's conformance suite on SMC
// connections (node 1 embedded and through krcored; fixed buffers, and
// adapting ones, which its streams make grow) and on connections that
// fell back to TCP.
func TestNetConn(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 32 << 10})
		cliNode := open(t, api, smc.NodeOptions{BufferSize: 32 << 10})
		srvAdapt, cliAdapt := open(t, srvAPI, smc.NodeOptions{}), open(t, api, smc.NodeOptions{})
		for _, mode := range []string{"smc", "adapting", "fallback"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				srv, cli := &smc.Options{Node: srvNode}, &smc.Options{Node: cliNode}
				switch mode {
				case "adapting":
					srv, cli = &smc.Options{Node: srvAdapt}, &smc.Options{Node: cliAdapt}
				case "fallback":
					srv = &smc.Options{} // declines
				}
				ln := listen(t, srv)
				nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
					acc := make(chan net.Conn, 1)
					go func() {
						c, _ := ln.Accept()
						acc <- c
					}()
					c1, err = smc.Dial("tcp", ln.Addr().String(), cli)
					if err != nil {
						return nil, nil, nil, err
					}
					c2 = <-acc
					if got := smc.ModeOf(c1).SMC; got != (mode != "fallback") {
						t.Errorf("mode %v", smc.ModeOf(c1))
					}
					return c1, c2, func() { c1.Close(); c2.Close() }, nil
				})
			})
		}
		if g := srvAdapt.Stats().Grows + cliAdapt.Stats().Grows; g == 0 {
			t.Errorf("%s: no adapting buffer grew under nettest's streams", name)
		}
	}
}
