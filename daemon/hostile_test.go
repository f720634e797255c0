package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
	"golang.org/x/sys/unix"
)

// TestHostileSocketPath: a socket path that names something other than a
// socket (a file, a directory, a symbolic link) is refused and left as it
// was, not deleted as a stale socket.
func TestHostileSocketPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "precious.txt")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty-dir")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, empty, link} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			before, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := daemon.New(c.Node(1), daemon.Config{Socket: path, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				srv.Close()
			}
			if !errors.Is(err, daemon.ErrNotSocket) || err != nil && !strings.Contains(err.Error(), path) {
				t.Errorf("socket %s: %v, want ErrNotSocket naming it", path, err)
			}
			after, err := os.Lstat(path)
			if err != nil {
				t.Fatalf("%s is gone: %v", path, err)
			}
			if after.Mode() != before.Mode() {
				t.Errorf("%s changed: %v, was %v", path, after.Mode(), before.Mode())
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("%s: %q %v", file, b, err)
	}
}

// rawClient is a client that speaks the wire protocol by hand.
type rawClient struct {
	t    *testing.T
	conn *net.UnixConn
	seq  uint64
}

func dialRaw(t *testing.T, sock string) *rawClient {
	t.Helper()
	nc, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawClient{t: t, conn: nc.(*net.UnixConn)}
}

// call sends m and returns the daemon's reply, failing the test if none
// comes within 10s.
func (c *rawClient) call(m *wire.Msg) *wire.Msg {
	c.t.Helper()
	c.seq++
	m.Seq = c.seq
	if err := wire.Send(c.conn, m); err != nil {
		c.t.Fatal(err)
	}
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	r, err := wire.Recv(c.conn)
	if err != nil {
		c.t.Fatalf("op %d: no reply: %v", m.Op, err)
	}
	if r.Seq != m.Seq {
		c.t.Fatalf("op %d: reply to seq %d, want %d", m.Op, r.Seq, m.Seq)
	}
	return r
}

// hello attaches and returns the daemon's largest message.
func (c *rawClient) hello() int {
	c.t.Helper()
	r := c.call(wire.NewMsg(wire.OpHello, 0).U32(wire.Version))
	if err := r.Error(); err != nil {
		c.t.Fatal(err)
	}
	r.GetU64()
	r.GetU64()
	r.GetU32()
	return int(r.GetU32())
}

// serveDaemon starts a daemon on node 1 of a two-node cluster; stop
// closes it, failing the test if that takes more than 10s.
func serveDaemon(t *testing.T) (c *cluster.Cluster, srv *daemon.Server, sock string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "krcored.sock")
	srv, err = daemon.New(c.Node(1), daemon.Config{Socket: sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		closed := make(chan struct{})
		go func() { srv.Close(); <-done; close(closed) }()
		select {
		case <-closed:
			c.Close()
		case <-time.After(10 * time.Second):
			t.Error("daemon Close still running after 10s")
		}
	}
	t.Cleanup(stop)
	return c, srv, sock, stop
}

// TestHostileBell: a client whose completion bell cannot take a write (an
// eventfd at its maximum count; a pipe is refused as a bell, see
// TestHostileControl) holds up no goroutine
// of the daemon: when it goes it is reclaimed, and the daemon closes.
func TestHostileBell(t *testing.T) {
	for _, tc := range []struct {
		name string
		bell func(t *testing.T) (give, keep int) // give goes to the daemon as the completion bell
	}{
		{"eventfd at its maximum", func(t *testing.T) (int, int) {
			fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			var max [8]byte
			binary.LittleEndian.PutUint64(max[:], 1<<64-2)
			if _, err := unix.Write(fd, max[:]); err != nil {
				t.Fatal(err)
			}
			return fd, fd
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv, sock, stop := serveDaemon(t)
			hc := dialRaw(t, sock)
			maxMsg := hc.hello()
			blk, err := offheap.AllocShared("hostile", wire.RingSize(maxMsg))
			if err != nil {
				t.Fatal(err)
			}
			defer blk.Close()
			door, _ := wire.NewBell()
			defer door.Close()
			msg, _ := wire.NewBell()
			defer msg.Close()
			give, keep := tc.bell(t)
			defer unix.Close(keep)
			m := wire.NewMsg(wire.OpQueue, 0)
			m.FDs = []int{blk.FD(), door.FD(), give, msg.FD()}
			r := hc.call(m)
			if r.Error() != nil {
				t.Fatal(r.Error())
			}
			vq := r.GetU64()
			if r := hc.call(wire.NewMsg(wire.OpConnect, 0).U64(vq).U64(2).U8(0).U32(0)); r.Error() != nil {
				t.Fatal(r.Error())
			}
			ring, _ := wire.NewRing(blk.Bytes(), maxMsg)
			ring.Ctr(wire.ClientCQ).Store(1) // "I sleep: ring my bell"
			for i := range uint64(4) {       // refused: no such MR; each completes
				ring.PutSQE(i, &wire.SQE{Op: uint8(verbs.OpRead), MR: 999, Len: 8})
			}
			ring.Ctr(wire.SQTail).Store(4)
			door.Ring()
			deadline := time.Now().Add(10 * time.Second)
			for ring.Ctr(wire.CQTail).Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // polling the ring, as a client does
			}
			ring.Ctr(wire.ClientCQ).Store(1)
			ring.PutSQE(4, &wire.SQE{Op: uint8(verbs.OpRead), MR: 999, Len: 8})
			ring.Ctr(wire.SQTail).Store(5)
			door.Ring()
			hc.conn.Close()
			for srv.Status().Reclaim == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the client with a stuck bell is not reclaimed 10s after it went")
				}
				time.Sleep(time.Millisecond) // polling the daemon's state
			}
			stop()
		})
	}
}

// TestHostileControl: control messages out of order, with unknown ops,
// short or oversized, carrying descriptors they should not, are refused
// (an error reply, or none for a message that does not parse) to that
// client only: it is still answered afterwards, and a well-behaved client
// is served throughout.
func TestHostileControl(t *testing.T) {
	_, _, sock, _ := serveDaemon(t)
	memfd := func(t *testing.T, size int, seal bool) int {
		fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	pipe := func(t *testing.T) int {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
		return p[0]
	}
	withFDs := func(m *wire.Msg, fds ...int) *wire.Msg { m.FDs = fds; return m }
	eventfd := func(t *testing.T) int {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	devZero := func(t *testing.T) int {
		fd, err := unix.Open("/dev/zero", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	ringSize := wire.RingSize(64 << 10)
	for _, tc := range []struct {
		name  string
		hello bool                         // HELLO first
		msg   func(t *testing.T) *wire.Msg // nil: raw bytes
		raw   []byte                       // sent as is when msg is nil
		want  error                        // in the reply; nil: no reply (does not parse)
	}{
		{name: "stats before hello", msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpStats, 0) }, want: verbs.ErrInvalid},
		{name: "status before hello", msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpStatus, 0) }, want: verbs.ErrInvalid},
		{name: "register before hello", msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0).U64(4096).U32(uint32(verbs.AccessAll)), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "hello twice", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpHello, 0).U32(wire.Version) }, want: verbs.ErrInvalid},
		{name: "hello wrong version", msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpHello, 0).U32(99) }, want: verbs.ErrInvalid},
		{name: "hello short", msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpHello, 0) }, want: verbs.ErrInvalid},
		{name: "op 0", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(0, 0) }, want: verbs.ErrInvalid},
		{name: "op 255", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(255, 0).U64(1) }, want: verbs.ErrInvalid},
		{name: "bye from the client", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpBye, 0).Str("x") }, want: verbs.ErrInvalid},
		{name: "register short", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "register no fd", hello: true, msg: func(*testing.T) *wire.Msg {
			return wire.NewMsg(wire.OpRegister, 0).U64(0).U64(4096).U32(uint32(verbs.AccessAll))
		}, want: verbs.ErrInvalid},
		{name: "register a pipe", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0).U64(4096).U32(uint32(verbs.AccessAll)), pipe(t))
		}, want: verbs.ErrInvalid},
		{name: "register unsealed", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0).U64(4096).U32(uint32(verbs.AccessAll)), memfd(t, 4096, false))
		}, want: verbs.ErrInvalid},
		{name: "register past the memfd", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(4096).U64(4096).U32(uint32(verbs.AccessAll)), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "register offset overflow", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(1<<64-4096).U64(8192).U32(uint32(verbs.AccessAll)), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "register zero bytes", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0).U64(0).U32(uint32(verbs.AccessAll)), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "register two fds", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpRegister, 0).U64(0).U64(4096).U32(uint32(verbs.AccessAll)), memfd(t, 4096, true), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "deregister unknown", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpDeregister, 0).U64(12345) }, want: krcore.ErrRefused},
		{name: "forget unknown region", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpForget, 0).U64(12345) }, want: krcore.ErrRefused},
		{name: "forget short", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpForget, 0).U32(1) }, want: verbs.ErrInvalid},
		{name: "forget before hello", msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpForget, 0).U64(1) }, want: verbs.ErrInvalid},
		{name: "export unknown MR", hello: true, msg: func(*testing.T) *wire.Msg {
			return wire.NewMsg(wire.OpExport, 0).Str("x").U64(12345).U64(0).U64(8).U32(uint32(verbs.AccessRemoteRead))
		}, want: krcore.ErrRefused},
		{name: "unexport not mine", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpUnexport, 0).Str("table") }, want: krcore.ErrRefused},
		{name: "region short", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpRegion, 0).U64(2) }, want: verbs.ErrInvalid},
		{name: "queue no fds", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpQueue, 0) }, want: verbs.ErrInvalid},
		{name: "queue pipes", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), pipe(t), pipe(t), pipe(t), pipe(t))
		}, want: verbs.ErrInvalid},
		{name: "queue good (the cases below differ in one descriptor)", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}},
		{name: "queue with a short body (FeatureQueueTo)", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0).U64(2), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue to node 0", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0).U64(0).U8(0).U32(0).Str(""), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue to a reserved port", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0).U64(2).U8(1).U32(1<<31).Str(""), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue with a region name too long", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0).U64(2).U8(0).U32(0).Str(strings.Repeat("n", 1000)), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue with a region not exported", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0).U64(2).U8(0).U32(0).Str("no such region"), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), eventfd(t))
		}, want: krcore.ErrNoRegion},
		{name: "queue with a pipe for a bell", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), memfd(t, ringSize, true), eventfd(t), pipe(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue with /dev/zero for a doorbell", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), memfd(t, ringSize, true), devZero(t), eventfd(t), eventfd(t))
		}, want: verbs.ErrInvalid},
		{name: "queue with a memfd for a control bell", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), memfd(t, ringSize, true), eventfd(t), eventfd(t), eventfd(t), memfd(t, 4096, true))
		}, want: verbs.ErrInvalid},
		{name: "queue small ring", hello: true, msg: func(t *testing.T) *wire.Msg {
			return withFDs(wire.NewMsg(wire.OpQueue, 0), memfd(t, 4096, true), pipe(t), pipe(t), pipe(t))
		}, want: verbs.ErrInvalid},
		{name: "connect unknown VQ", hello: true, msg: func(*testing.T) *wire.Msg {
			return wire.NewMsg(wire.OpConnect, 0).U64(12345).U64(2).U8(0).U32(0)
		}, want: krcore.ErrRefused},
		{name: "region as an unknown VQ's port", hello: true, msg: func(*testing.T) *wire.Msg {
			return wire.NewMsg(wire.OpVQRegion, 0).U64(12345).Str("table")
		}, want: krcore.ErrRefused},
		{name: "close unknown VQ", hello: true, msg: func(*testing.T) *wire.Msg { return wire.NewMsg(wire.OpCloseVQ, 0).U64(12345) }, want: krcore.ErrRefused},
		{name: "stats with an fd", hello: true, msg: func(t *testing.T) *wire.Msg { return withFDs(wire.NewMsg(wire.OpStats, 0), pipe(t)) }},
		{name: "short header", hello: true, raw: []byte{byte(wire.OpStats), 0, 0}},
		{name: "empty message", hello: true, raw: []byte{}},
		{name: "oversized", hello: true, raw: make([]byte, wire.MaxMessage+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := dialRaw(t, sock)
			if tc.hello {
				hc.hello()
			}
			if tc.msg == nil {
				if _, err := hc.conn.Write(tc.raw); err != nil {
					t.Fatal(err)
				}
				if len(tc.raw) == 0 {
					return // a zero-length SEQPACKET message reads as the peer's close
				}
			} else {
				r := hc.call(tc.msg(t))
				if err := r.Error(); tc.want == nil && err != nil {
					t.Errorf("reply %v", err)
				} else if tc.want != nil && !errors.Is(err, tc.want) {
					t.Errorf("reply %v, want %v", err, tc.want)
				}
			}
			if !tc.hello && tc.want != nil {
				hc.hello() // refused before HELLO, attached after it
			}
			// still answered, the refusal counted
			if r := hc.call(wire.NewMsg(wire.OpStats, 0)); r.Error() != nil {
				t.Fatalf("stats after: %v", r.Error())
			}
		})
	}
}

// TestHostileManyConnections: a user who opens connections until the
// daemon runs out of descriptors makes new clients wait, not the daemon
// stop: once they close, a client attaches and works.
func TestHostileManyConnections(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	_, srv, sock, _ := serveDaemon(t)
	// the daemon shares this process's descriptor table: leave it 64 more
	fds, _ := os.ReadDir("/proc/self/fd")
	low := lim
	low.Cur = uint64(len(fds) + 64)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 200 { // past the limit: the listen backlog takes the rest, then dialing fails
		c, err := net.DialTimeout("unixpacket", sock, time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	// the daemon has taken every descriptor left (opening one fails)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.Open("/dev/null")
		if err != nil {
			break
		}
		f.Close()
		if time.Now().After(deadline) {
			t.Fatal("the daemon never reached the descriptor limit")
		}
		time.Sleep(time.Millisecond) // polling the descriptor table
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	hc := dialRaw(t, sock) // served: the daemon kept accepting
	hc.hello()
	if r := hc.call(wire.NewMsg(wire.OpStats, 0)); r.Error() != nil {
		t.Fatal(r.Error())
	}
	if srv.Status().Attached < 2 {
		t.Errorf("attached %d", srv.Status().Attached)
	}
}
