package smc_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/smc"
)

// BenchmarkLaterDial: a Dial between two Nodes whose link exists, its
// first byte written and the connection closed, against a server that
// reads until EOF (krbench smc's smc-connect, in one process). The
// allocations are both ends'; writes/op and cdcs/op count the RDMA
// WRITEs and CDC messages of both.
func BenchmarkLaterDial(b *testing.B) {
	srvAPI, clients := apis(b)
	srvNode := open(b, srvAPI, smc.NodeOptions{})
	cliNode := open(b, clients["embedded"], smc.NodeOptions{})
	ln := listen(b, &smc.Options{Node: srvNode})
	srv := startSink(ln)
	defer srv.stop()
	opts := &smc.Options{Node: cliNode}
	dial := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := smc.DialContext(ctx, "tcp", ln.Addr().String(), opts)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if m := smc.ModeOf(c); !m.SMC {
			b.Fatalf("fell back: %v", m)
		}
		if _, err := c.Write([]byte{'p'}); err != nil {
			b.Fatal(err)
		}
	}
	dial() // the first connect makes the queue and the slabs
	s0, c0 := srvNode.Stats(), cliNode.Stats()
	n := 0
	for b.Loop() {
		dial()
		n++
	}
	s1, c1 := srvNode.Stats(), cliNode.Stats()
	per := func(v uint64) float64 { return float64(v) / float64(max(n, 1)) }
	b.ReportMetric(per(s1.Writes-s0.Writes+c1.Writes-c0.Writes), "writes/op")
	b.ReportMetric(per(s1.CursorMsgs-s0.CursorMsgs+c1.CursorMsgs-c0.CursorMsgs), "cdcs/op")
}

// sinkServer reads each connection ln accepts until EOF, a goroutine
// each.
type sinkServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startSink(ln net.Listener) *sinkServer {
	s := &sinkServer{ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	return s
}

func (s *sinkServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			io.Copy(io.Discard, c)
			c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// stop closes the listener and the connections still open, and waits
// for the server's goroutines.
func (s *sinkServer) stop() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
