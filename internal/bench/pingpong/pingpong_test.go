package pingpong

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/verbs"
)

// rxeGID is rxe0's RoCE v2 GID on 10.0.0.1 in the test VM.
var rxeGID = verbs.GID{10: 0xff, 11: 0xff, 12: 10, 15: 1}

// cMsg is a message as rc_pingpong.c writes it: sprintf's text and the
// rest of its fixed buffer (the NUL).
func cMsg(text string) []byte {
	b := make([]byte, ppMsgLen)
	copy(b, text)
	return b
}

func TestPPMsgMatchesC(t *testing.T) {
	// What ibv_rc_pingpong -g 1 on rxe0 sent in the VM (QPN 0x13, PSN
	// 0x97e4cd): gid_to_wire_gid prints each 32-bit word big-endian, so
	// the 32 digits are the GID's bytes in order.
	want := cMsg("0000:000013:97e4cd:00000000000000000000ffff0a000001")
	d := ppDest{LID: 0, QPN: 0x13, PSN: 0x97e4cd, GID: rxeGID}
	got, err := encodePPMsg(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encode = %q, want %q", got, want)
	}
	if ppMsgLen != 52 {
		t.Fatalf("message length %d, the C tool reads and writes 52 bytes", ppMsgLen)
	}
	back, err := decodePPMsg(want)
	if err != nil {
		t.Fatal(err)
	}
	if back != d {
		t.Fatalf("decode = %+v, want %+v", back, d)
	}
	if s := d.String(); s != "LID 0x0000, QPN 0x000013, PSN 0x97e4cd, GID ::ffff:10.0.0.1" {
		t.Fatalf("address line %q is not the C tool's", s)
	}
}

func TestPPMsgRoundTrip(t *testing.T) {
	link := verbs.GID{0xfe, 0x80, 8: 0x4c, 0xf6, 0x1c, 0xff, 0xfe, 0x26, 0xdf, 0xdd}
	for _, d := range []ppDest{
		{},
		{LID: 0xffff, QPN: 0xffffff, PSN: 0xffffff, GID: verbs.GID{0: 0xff, 15: 0xff}},
		{LID: 0x1a, QPN: 0x000abc, PSN: 0x000001, GID: link},
		{QPN: 7, PSN: 0x123456, GID: rxeGID},
	} {
		b, err := encodePPMsg(d)
		if err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		if len(b) != ppMsgLen || b[len(b)-1] != 0 || bytes.IndexByte(b, 0) != ppMsgLen-1 {
			t.Fatalf("%+v: %q is not 51 characters and a NUL", d, b)
		}
		got, err := decodePPMsg(b)
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if got != d {
			t.Fatalf("round trip of %+v gave %+v", d, got)
		}
	}
	if g, err := parseWireGID(wireGID(link)); err != nil || g != link {
		t.Fatalf("GID round trip: %v %v", g, err)
	}
	if s := NtopGID(link); s != "fe80::4cf6:1cff:fe26:dfdd" {
		t.Fatalf("ntop(link-local) = %q", s)
	}
	if s := NtopGID(verbs.GID{}); s != "::" {
		t.Fatalf("ntop(zero) = %q", s)
	}
}

func TestPPMsgEncodeRejectsWideFields(t *testing.T) {
	for _, d := range []ppDest{{QPN: 1 << 24}, {PSN: 1 << 24}} {
		if _, err := encodePPMsg(d); !errors.Is(err, errPPMsg) {
			t.Fatalf("%+v: err %v, want errPPMsg", d, err)
		}
	}
}

func TestPPMsgDecodeRejectsMalformed(t *testing.T) {
	good := "0000:000013:97e4cd:00000000000000000000ffff0a000001"
	long := append(cMsg(good), 0)
	for _, c := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"short read", []byte(good), "51 bytes, want 52"},
		{"long", long, "53 bytes, want 52"},
		{"empty", make([]byte, ppMsgLen), "empty"},
		{"three fields", cMsg("0000:000013:00000000000000000000ffff0a000001"), "3 colon-separated fields"},
		{"five fields", cMsg("0:13:97e4cd:00000000000000000000ffff0a000001:"), "5 colon-separated fields"},
		{"LID not hex", cMsg("00g0:000013:97e4cd:00000000000000000000ffff0a000001"), `LID "00g0" is not hex`},
		{"LID too wide", cMsg("00000:00013:97e4cd:00000000000000000000ffff0a000001"), `LID "00000": want 1 to 4 hex digits`},
		{"QPN empty", cMsg("0000::97e4cd:00000000000000000000ffff0a0000010"), `QPN "": want 1 to 6 hex digits`},
		{"PSN too wide", cMsg("000:000013:97e4cd0:00000000000000000000ffff0a000001"), `PSN "97e4cd0": want 1 to 6 hex digits`},
		{"PSN signed", cMsg("0000:000013:-7e4cd:00000000000000000000ffff0a000001"), `PSN "-7e4cd" is not hex`},
		{"GID short", cMsg("0000:000013:97e4cd:00000000000000000000ffff0a0000"), "has 30 hex digits, want 32"},
		{"GID not hex", cMsg("0000:000013:97e4cd:00000000000000000000ffff0a00000z"), "is not hex"},
		{"junk after NUL", nulAt(cMsg(good), 10), "after the terminating NUL"},
	} {
		_, err := decodePPMsg(c.msg)
		if !errors.Is(err, errPPMsg) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %q: err %v, want errPPMsg saying %q", c.name, c.msg, err, c.want)
		}
	}
}

// nulAt puts a NUL at b[i], leaving text after it.
func nulAt(b []byte, i int) []byte {
	b[i] = 0
	return b
}

// TestPPExchange runs both halves of the exchange against each other over
// loopback TCP, and each against a peer that behaves as the C tool does.
func TestPPExchange(t *testing.T) {
	ctx := context.Background()
	srvDest := ppDest{QPN: 0x12, PSN: 0x195cf8, GID: rxeGID}
	cliDest := ppDest{QPN: 0x13, PSN: 0x97e4cd, GID: rxeGID}

	t.Run("krbench both sides", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		var connected ppDest
		type res struct {
			d   ppDest
			err error
		}
		srv := make(chan res, 1)
		go func() {
			d, err := ppServerExchange(ctx, ln, cfg, srvDest, func(d ppDest) error { connected = d; return nil })
			srv <- res{d, err}
		}()
		got, err := ppClientExchange(ctx, cfg, cliDest)
		if err != nil || got != srvDest {
			t.Fatalf("client got %+v, %v; want %+v", got, err, srvDest)
		}
		r := <-srv
		if r.err != nil || r.d != cliDest || connected != cliDest {
			t.Fatalf("server got %+v (connected %+v), %v; want %+v", r.d, connected, r.err, cliDest)
		}
	})

	t.Run("C client", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		srv := make(chan error, 1)
		go func() {
			_, err := ppServerExchange(ctx, ln, cfg, srvDest, func(ppDest) error { return nil })
			srv <- err
		}()
		c := dialT(t, ln.Addr().String())
		c.Write(cMsg("0000:000013:97e4cd:00000000000000000000ffff0a000001"))
		reply := make([]byte, ppMsgLen)
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		if want := cMsg("0000:000012:195cf8:00000000000000000000ffff0a000001"); !bytes.Equal(reply, want) {
			t.Fatalf("server answered %q, want %q", reply, want)
		}
		c.Write([]byte("done\x00"))
		if err := <-srv; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("C server", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		peer := make(chan []byte, 2)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			m := make([]byte, ppMsgLen)
			io.ReadFull(c, m)
			peer <- m
			c.Write(cMsg("0000:000012:195cf8:00000000000000000000ffff0a000001"))
			// rc_pingpong.c reads up to 52 bytes and wants exactly 5. A
			// fresh buffer: m may not have been checked yet.
			d := make([]byte, ppMsgLen)
			n, _ := c.Read(d)
			peer <- d[:n]
		}()
		got, err := ppClientExchange(ctx, cfg, cliDest)
		if err != nil || got != srvDest {
			t.Fatalf("client got %+v, %v", got, err)
		}
		if m := <-peer; !bytes.Equal(m, cMsg("0000:000013:97e4cd:00000000000000000000ffff0a000001")) {
			t.Fatalf("client sent %q", m)
		}
		if m := <-peer; string(m) != "done\x00" {
			t.Fatalf("client closed with %q, want \"done\\x00\"", m)
		}
	})

	t.Run("bad done", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		srv := make(chan error, 1)
		go func() {
			_, err := ppServerExchange(ctx, ln, cfg, srvDest, func(ppDest) error { return nil })
			srv <- err
		}()
		c := dialT(t, ln.Addr().String())
		c.Write(cMsg("0000:000013:97e4cd:00000000000000000000ffff0a000001"))
		io.ReadFull(c, make([]byte, ppMsgLen))
		c.Write([]byte("nope!"))
		if err := <-srv; !errors.Is(err, errPPMsg) || !strings.Contains(err.Error(), `"nope!"`) {
			t.Fatalf("err %v, want a complaint about the missing done", err)
		}
	})

	t.Run("malformed from client", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		srv := make(chan error, 1)
		go func() {
			_, err := ppServerExchange(ctx, ln, cfg, srvDest, func(ppDest) error { return errors.New("must not connect") })
			srv <- err
		}()
		c := dialT(t, ln.Addr().String())
		c.Write(cMsg("hello, is this the pingpong server?"))
		if err := <-srv; !errors.Is(err, errPPMsg) {
			t.Fatalf("err %v, want errPPMsg", err)
		}
	})

	t.Run("silent peer times out", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		cfg.timeout = 200 * time.Millisecond
		go func() {
			c, err := ln.Accept()
			if err == nil {
				time.Sleep(time.Second)
				c.Close()
			}
		}()
		start := time.Now()
		_, err := ppClientExchange(ctx, cfg, cliDest)
		if err == nil || time.Since(start) > 900*time.Millisecond {
			t.Fatalf("err %v after %v, want a timeout within -timeout", err, time.Since(start))
		}
	})

	t.Run("client retries until the server listens", func(t *testing.T) {
		ln := listenLoopback(t)
		cfg := ppTestConfig(ln)
		ln.Close() // refused for now
		srv := make(chan error, 1)
		go func() {
			time.Sleep(150 * time.Millisecond)
			ln2, err := net.Listen("tcp", ln.Addr().String())
			if err != nil {
				srv <- err
				return
			}
			defer ln2.Close()
			_, err = ppServerExchange(ctx, ln2, cfg, srvDest, func(ppDest) error { return nil })
			srv <- err
		}()
		if _, err := ppClientExchange(ctx, cfg, cliDest); err != nil {
			t.Fatal(err)
		}
		if err := <-srv; err != nil {
			t.Fatal(err)
		}
	})
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func ppTestConfig(ln net.Listener) *ppConfig {
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	p, _ := strconv.Atoi(port)
	return &ppConfig{server: "127.0.0.1", port: p, timeout: 5 * time.Second}
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPingpongFlags(t *testing.T) {
	if !ibverbs.Built {
		// Without the rdma tag every pingpong is a usage error naming the
		// missing provider, with exit status 2.
		var out, errb bytes.Buffer
		if code := Run(context.Background(), []string{"-g", "1", "10.0.0.1"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "built without rdma support") {
			t.Fatalf("exit %d, stderr %q; want 2 and the provider's error", code, errb.String())
		}
		return
	}
	cfg, err := parsePingpong([]string{"-d", "rxe0", "10.0.0.1", "--gid-idx", "1", "-s", "0x100", "-e", "-c"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.server != "10.0.0.1" || cfg.dev != "rxe0" || cfg.gidIdx != 1 || cfg.size != 256 || !cfg.events || !cfg.chk ||
		cfg.port != 18515 || cfg.mtu != 1024 || cfg.rxDepth != 500 || cfg.iters != 1000 {
		t.Fatalf("parsed %+v", cfg)
	}
	for _, args := range [][]string{
		{"-l", "3"}, {"-m", "1000"}, {"-r", "1"}, {"-n", "0"}, {"-p", "70000"}, {"-i", "0"}, {"a", "b"}, {"-o"},
	} {
		if _, err := parsePingpong(args, io.Discard); !errors.Is(err, flags.ErrUsage) {
			t.Errorf("%q: err %v, want a usage error", args, err)
		}
	}
}
