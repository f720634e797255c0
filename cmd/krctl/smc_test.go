package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/smc"
)

// TestSMC: an SMC Node in a client of krcored reports its connections
// (one over SMC, one that fell back to TCP) and counters; krctl smc
// lists them as the Node itself does, -json too, /metrics carries the
// counters, and the report goes when the Node closes.
func TestSMC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, srv, sock, cl := startDaemon(t, ctx)

	server, err := smc.Open(cl, smc.NodeOptions{BufferSize: smc.MinBufferSize, ReportEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	dialer, err := smc.Open(core.Embed(c.Node(2)), smc.NodeOptions{BufferSize: smc.MinBufferSize})
	if err != nil {
		t.Fatal(err)
	}
	defer dialer.Close()
	ln, err := smc.Listen("tcp", "127.0.0.1:0", &smc.Options{Node: server})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// One SMC connection carrying 10,000 bytes, one plain TCP client.
	accepted := make(chan net.Conn, 2)
	go func() {
		for range 2 {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- a
		}
	}()
	sc, err := smc.DialContext(ctx, "tcp", ln.Addr().String(), &smc.Options{Node: dialer})
	if err != nil || !smc.ModeOf(sc).SMC {
		t.Fatalf("dial: %v %v", err, smc.ModeOf(sc))
	}
	defer sc.Close()
	a1 := <-accepted
	defer a1.Close()
	payload := bytes.Repeat([]byte("smc!"), smc.MinBufferSize*5/8) // wraps the ring twice
	go func() { sc.Write(payload); sc.(*smc.Conn).CloseWrite() }()
	if got, err := io.ReadAll(a1); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("read %d bytes: %v", len(got), err)
	}
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	tc.Write([]byte("plain"))
	a2 := <-accepted
	defer a2.Close()
	if err := a2.(*smc.Conn).Handshake(ctx); err != nil || smc.ModeOf(a2).Reason != smc.ReasonPeerNoSMC {
		t.Fatalf("plain client: %v %v", err, smc.ModeOf(a2))
	}

	// krctl -json, once the Node's report caught up with its state.
	want := server.Stats()
	var nodes []smcNode
	for {
		var out bytes.Buffer
		if err := run(ctx, []string{"-socket", sock, "-json", "smc"}, &out); err != nil {
			t.Fatal(err)
		}
		nodes = nil
		if err := json.Unmarshal(out.Bytes(), &nodes); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		if len(nodes) == 1 && len(nodes[0].Conns) == 2 && nodes[0].Conns[0].State == "PEERCLW" &&
			nodes[0].Stats.BytesReceived == want.BytesReceived && nodes[0].Stats.Fallbacks[smc.ReasonPeerNoSMC] == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("krctl smc -json never showed the Node's two connections: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	n := nodes[0]
	s, f := n.Conns[0], n.Conns[1]
	if n.PID == 0 || n.Port != server.Port() || n.Stats.SMC != 1 || n.Stats.Fallbacks[smc.ReasonPeerNoSMC] != 1 ||
		n.Stats.BytesReceived != uint64(len(payload)) || n.Stats.Writes != want.Writes || n.Stats.CursorMsgs != want.CursorMsgs {
		t.Errorf("counters %+v, want %+v", n.Stats, want)
	}
	if s.Mode != "SMC" || s.Role != "server" || s.Local != a1.LocalAddr().String() || s.Foreign != a1.RemoteAddr().String() ||
		s.RMB != smc.MinBufferSize || s.PeerRMB != smc.MinBufferSize || s.Token == 0 || s.BytesReceived != uint64(len(payload)) ||
		s.Cons != (smc.Cursor{Wrap: uint16(len(payload) / smc.MinBufferSize), Off: uint32(len(payload) % smc.MinBufferSize)}) || s.Prod != s.Cons {
		t.Errorf("SMC row %+v", s)
	}
	if f.Mode != "TCP" || f.Reason != smc.ReasonPeerNoSMC || f.State != "ACTIVE" || f.Token != 0 {
		t.Errorf("fallback row %+v", f)
	}

	// The tables.
	var out bytes.Buffer
	if err := run(ctx, []string{"-socket", sock, "smc"}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("krctl smc\n%s", out.String())
	for _, w := range []string{"PEERCLW  server", "SMC", "peer did not indicate SMC", s.Cons.String(), "FALLBACK_REASON", "0x03010000  1", "total"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("krctl smc lacks %q", w)
		}
	}

	// /metrics: the same counters, labelled by client and port.
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, m := range []struct{ name, label, value string }{
		{"krcored_smc_connections_total", "", "1"}, {"krcored_smc_received_bytes_total", "", strconv.Itoa(len(payload))},
		{"krcored_smc_rdma_writes_total", "", "0"}, {"krcored_smc_cursor_messages_total", "", strconv.FormatUint(want.CursorMsgs, 10)},
		{"krcored_smc_fallbacks_total", `reason="peer did not indicate SMC"`, "1"},
		{"krcored_smc_open_connections", `mode="SMC"`, "1"}, {"krcored_smc_open_connections", `mode="TCP"`, "1"},
		{"krcored_smc_buffer_grows_total", "", "0"}, {"krcored_smc_buffer_memory_bytes", "", strconv.FormatInt(want.Memory, 10)},
	} {
		if !hasSeries(body, m.name, m.label, m.value) {
			t.Errorf("/metrics lacks %s{%s} %s:\n%s", m.name, m.label, m.value, grepLines(body, "krcored_smc_"))
		}
	}

	// A report under an smc name that is no smc.Report (any client may
	// keep one) is listed as unreadable; the rest still show.
	if err := cl.Report(ctx, "smc/bogus", []byte(`{"port":"x"}`)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "smc"}, &out); err != nil || !strings.Contains(out.String(), "unreadable report smc/bogus") ||
		!strings.Contains(out.String(), "PEERCLW") {
		t.Errorf("with a bogus report: %v\n%s", err, out.String())
	}
	cl.Report(ctx, "smc/bogus", nil)

	// Close withdraws the report.
	server.Close()
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "-json", "smc"}, &out); err != nil || strings.TrimSpace(out.String()) != "[]" {
		t.Errorf("after Close: %v %s", err, out.String())
	}
}

// hasSeries says whether the exposition body has a series of name with
// label (and the client's labels) whose value is value.
func hasSeries(body, name, label, value string) bool {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+"{") && strings.Contains(l, label) && strings.HasSuffix(l, "} "+value) {
			return true
		}
	}
	return false
}

func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
