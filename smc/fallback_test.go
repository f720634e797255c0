package smc_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/smc"
)

// expect reads line from c and fails unless it is want.
func expect(t testing.TB, r *bufio.Reader, want string) {
	t.Helper()
	got, err := r.ReadString('\n')
	if err != nil || got != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// echoOnce serves one line: a server that reads first (client-first).
func echoOnce(t testing.TB, c net.Conn) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Error(err)
		return
	}
	c.Write([]byte("echo " + line))
}

// TestFallback: each way setup can fail ends on TCP with the reason on
// both ends, and the application's bytes all arrive once, in order.
func TestFallback(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{})
			cliNode := open(t, api, smc.NodeOptions{})
			cases := []struct {
				name             string
				srv, cli         *smc.Options
				wantSrv, wantCli smc.Reason
				wantPeer         smc.Reason
			}{
				{"client without runtime", &smc.Options{Node: srvNode}, &smc.Options{}, smc.ReasonPeerNoSMC, smc.ReasonNoRuntime, 0},
				{"server without runtime", &smc.Options{}, &smc.Options{Node: cliNode}, smc.ReasonNoRuntime, smc.ReasonPeerDeclined, smc.ReasonNoRuntime},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					ln := listen(t, tc.srv)
					s, c := pair(t, ln, tc.cli)
					go echoOnce(t, s)
					if _, err := c.Write([]byte("hello\n")); err != nil {
						t.Fatal(err)
					}
					expect(t, bufio.NewReader(c), "echo hello\n")
					if m := smc.ModeOf(c); m.SMC || m.Reason != tc.wantCli || m.Peer != tc.wantPeer {
						t.Fatalf("client mode %v, want TCP: %v (peer %v)", m, tc.wantCli, tc.wantPeer)
					}
					if m := settled(t, s); m.SMC || m.Reason != tc.wantSrv {
						t.Fatalf("server mode %v, want TCP: %v", m, tc.wantSrv)
					}
				})
			}
		})
	}
}

// TestPlainClients: an SMC listener serves plain net.Dial clients of a
// client-first protocol and of a server-first one (whose greeting waits
// at most DetectWait), beside an SMC client.
func TestPlainClients(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{})
	ln := listen(t, &smc.Options{Node: srvNode})
	ctx := ctxT(t)

	// Client first: the server reads the plain client's bytes as data.
	go func() {
		s, err := ln.Accept()
		if err == nil {
			echoOnce(t, s)
			s.Close()
		}
	}()
	var d net.Dialer
	pc, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pc.Write([]byte("plain\n"))
	expect(t, bufio.NewReader(pc), "echo plain\n")

	// Server first: the greeting goes out though the client sends nothing.
	greet := func(s net.Conn) {
		s.Write([]byte("220 ready\n"))
		echoOnce(t, s)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			greet(s)
		}
		accepted <- s
	}()
	start := time.Now()
	pc2, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc2.Close()
	r := bufio.NewReader(pc2)
	expect(t, r, "220 ready\n")
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a server-first greeting took %v", d)
	}
	pc2.Write([]byte("helo\n"))
	expect(t, r, "echo helo\n")
	if s := <-accepted; s != nil {
		if m := smc.ModeOf(s); m.SMC || m.Reason != smc.ReasonPeerNoSMC {
			t.Fatalf("server-first plain client: mode %v", m)
		}
		s.Close()
	}

	// Server first with an SMC client: whichever mode wins, both ends agree
	// and the greeting and the exchange arrive whole.
	go func() {
		s, err := ln.Accept()
		if err == nil {
			greet(s)
		}
		accepted <- s
	}()
	sc, err := smc.DialContext(ctx, "tcp", ln.Addr().String(), &smc.Options{Node: cliNode})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	r = bufio.NewReader(sc)
	expect(t, r, "220 ready\n")
	sc.Write([]byte("helo\n"))
	expect(t, r, "echo helo\n")
	s := <-accepted
	defer s.Close()
	if ms, mc := smc.ModeOf(s), smc.ModeOf(sc); ms.SMC != mc.SMC {
		t.Fatalf("server mode %v, client mode %v", ms, mc)
	}
}

// TestUnreachable: a client whose runtime cannot reach the server's
// buffer declines (ReasonLink); both run TCP.
func TestUnreachable(t *testing.T) {
	srvAPI, _ := apis(t)
	other, err := cluster.Start(ctxT(t), cluster.Config{Nodes: 1}) // a cluster the server is not in
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	srvNode := open(t, srvAPI, smc.NodeOptions{})
	cliNode := open(t, core.Embed(other.Node(1)), smc.NodeOptions{})
	ln := listen(t, &smc.Options{Node: srvNode, HandshakeTimeout: 2 * time.Second})
	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	go echoOnce(t, s)
	c.Write([]byte("hi\n"))
	expect(t, bufio.NewReader(c), "echo hi\n")
	m := smc.ModeOf(c)
	if m.SMC || m.Reason != smc.ReasonLink {
		t.Fatalf("client mode %v, want TCP: %v", m, smc.ReasonLink)
	}
	// The side that failed keeps its error; the peer learns the reason alone.
	if !errors.Is(m.Err, krcore.ErrUnreachable) || !strings.Contains(m.String(), m.Err.Error()) {
		t.Fatalf("client mode %v: its error %v, want one wrapping %v, in the mode's string", m, m.Err, krcore.ErrUnreachable)
	}
	if m := settled(t, s); m.Reason != smc.ReasonPeerDeclined || m.Peer != smc.ReasonLink || m.Err != nil {
		t.Fatalf("server mode %v (error %v), want declined: %v", m, m.Err, smc.ReasonLink)
	}
}

// TestTimeout: a server that never answers the proposal makes the client
// fall back after HandshakeTimeout; the server's late CLC answer is
// stripped and its data after it arrives whole.
func TestTimeout(t *testing.T) {
	_, clients := apis(t)
	cliNode := open(t, clients["embedded"], smc.NodeOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		<-release
		// A late decline in RFC 7609's shape, then the application's bytes.
		late := []byte{0xe2, 0xd4, 0xc3, 0xd9, 0x04, 0, 28, 0x10}
		late = append(late, make([]byte, 16)...)
		late = append(late, 0xe2, 0xd4, 0xc3, 0xd9)
		s.Write(append(late, "data after\n"...))
		s.Read(make([]byte, 1)) // until the client closes
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := smc.DialContext(ctx, "tcp", ln.Addr().String(), &smc.Options{Node: cliNode, HandshakeTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("dial took %v with a 200ms handshake timeout", d)
	}
	if m := smc.ModeOf(c); m.Reason != smc.ReasonTimeout {
		t.Fatalf("mode %v, want %v", m, smc.ReasonTimeout)
	}
	close(release)
	expect(t, bufio.NewReader(c), "data after\n")
	if !strings.Contains(smc.ModeOf(c).String(), "timeout") {
		t.Fatalf("mode text %q", smc.ModeOf(c))
	}
}
