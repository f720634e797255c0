package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// The C header include/krcore.h speaks this protocol from C. These tests
// build C programs with the system compiler ($CC, else cc, gcc or clang):
// one that prints the header's constants and reads and writes a ring Go
// laid out, so the header cannot drift from package wire; and
// examples/c/krread.c, run against a daemon.

// cc is the C compiler, or the test is skipped.
func cc(t *testing.T) string {
	t.Helper()
	names := []string{"cc", "gcc", "clang"}
	if env := os.Getenv("CC"); env != "" {
		names = append([]string{env}, names...)
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Skip("no C compiler (cc, gcc, clang or $CC) found: include/krcore.h not checked; install gcc")
	return ""
}

// buildC compiles src (relative to the repository root) with the header's
// include directory, warnings as errors.
func buildC(t *testing.T, src string) string {
	t.Helper()
	compiler := cc(t)
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	cmd := exec.Command(compiler, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic",
		"-I", filepath.Join("..", "include"), filepath.Join("..", src), "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out
}

// parseLines reads "NAME VALUE" lines.
func parseLines(t *testing.T, b []byte) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, ok := strings.Cut(l, " ")
		if !ok {
			t.Fatalf("bad line %q", l)
		}
		m[k] = v
	}
	return m
}

// TestCHeaderMatchesWire checks include/krcore.h against package wire: its
// constants, and its ring accessors on a ring Go wrote (and Go reads the
// SQE C wrote).
func TestCHeaderMatchesWire(t *testing.T) {
	bin := buildC(t, "daemon/testdata/krcore_check.c")

	const maxMsg = 4000
	mem := make([]byte, wire.RingSize(maxMsg))
	ring, err := wire.NewRing(mem, maxMsg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range wire.ClientMsg + 1 {
		ring.Ctr(i).Store(uint64(1000 + i))
	}
	ring.PutSQE(5, &wire.SQE{Op: uint8(verbs.OpCompareSwap), Flags: wire.FlagUnsignaled, Imm: 0xdeadbeef, MR: 21,
		Off: 22, Len: 23, Region: 24, RemoteOff: 25, Compare: 1 << 40, Swap: 1<<63 | 7})
	ring.PutCQE(7, wire.CQE{Seq: 1<<50 + 3, Status: verbs.RemAccessErr, Len: 4096})
	ring.PutMsg(3, wire.MsgHdr{Flags: wire.MsgHasImm, Status: verbs.Success, Len: 5, Imm: 77, From: 2, Port: 9},
		[]byte("hello"))
	file := filepath.Join(t.TempDir(), "ring")
	if err := os.WriteFile(file, mem, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, file, strconv.Itoa(maxMsg)).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	got := parseLines(t, out)

	want := map[string]any{
		"KRC_VERSION": wire.Version, "KRC_HEADER_LEN": wire.HeaderLen, "KRC_MAX_MESSAGE": wire.MaxMessage,
		"KRC_SPIN_NS":  wire.SpinFor.Nanoseconds(),
		"KRC_OP_HELLO": wire.OpHello, "KRC_OP_REGISTER": wire.OpRegister, "KRC_OP_DEREGISTER": wire.OpDeregister,
		"KRC_OP_EXPORT": wire.OpExport, "KRC_OP_UNEXPORT": wire.OpUnexport, "KRC_OP_REGION": wire.OpRegion,
		"KRC_OP_QUEUE": wire.OpQueue, "KRC_OP_CONNECT": wire.OpConnect, "KRC_OP_BIND": wire.OpBind,
		"KRC_OP_UNBIND": wire.OpUnbind, "KRC_OP_CLOSE_VQ": wire.OpCloseVQ, "KRC_OP_STATS": wire.OpStats,
		"KRC_OP_STATUS": wire.OpStatus, "KRC_OP_BYE": wire.OpBye, "KRC_OP_VQ_REGION": wire.OpVQRegion,
		"KRC_CODE_OK": wire.CodeOK, "KRC_CODE_OTHER": wire.CodeOther, "KRC_CODE_CLOSED": wire.CodeClosed,
		"KRC_CODE_NOT_CONNECTED": wire.CodeNotConnected, "KRC_CODE_PORT_IN_USE": wire.CodePortInUse,
		"KRC_CODE_NO_REGION": wire.CodeNoRegion, "KRC_CODE_UNREACHABLE": wire.CodeUnreachable,
		"KRC_CODE_REFUSED": wire.CodeRefused, "KRC_CODE_INVALID": wire.CodeInvalid, "KRC_CODE_BUSY": wire.CodeBusy,
		"KRC_CODE_DEADLINE": wire.CodeDeadline, "KRC_CODE_LIMIT": wire.CodeLimit, "KRC_CODE_CANCELED": wire.CodeCanceled,
		"KRC_SQ_ENTRIES": wire.SQEntries, "KRC_CQ_ENTRIES": wire.CQEntries, "KRC_MSG_ENTRIES": wire.MsgEntries,
		"KRC_SQE_LEN": wire.SQELen, "KRC_CQE_LEN": wire.CQELen, "KRC_MSGHDR_LEN": wire.MsgHdrLen,
		"KRC_CTR_SQ_TAIL": wire.SQTail, "KRC_CTR_SQ_HEAD": wire.SQHead, "KRC_CTR_CQ_TAIL": wire.CQTail,
		"KRC_CTR_CQ_HEAD": wire.CQHead, "KRC_CTR_RETIRED": wire.Retired, "KRC_CTR_MSG_TAIL": wire.MsgTail,
		"KRC_CTR_MSG_HEAD": wire.MsgHead, "KRC_CTR_DAEMON_SLEEPS": wire.DaemonSleeps,
		"KRC_CTR_DAEMON_FULL_CQ": wire.DaemonFullCQ, "KRC_CTR_DAEMON_FULL_MSG": wire.DaemonFullMsg,
		"KRC_CTR_CLIENT_CQ": wire.ClientCQ, "KRC_CTR_CLIENT_MSG": wire.ClientMsg,
		"KRC_OP_RECV": wire.OpRecv, "KRC_SQE_UNSIGNALED": wire.FlagUnsignaled,
		"KRC_MSG_IN_BUF": wire.MsgInBuf, "KRC_MSG_HAS_IMM": wire.MsgHasImm,
		"KRC_MSG_WRITE": wire.MsgWrite,
		"KRC_WR_SEND":   verbs.OpSend, "KRC_WR_SEND_IMM": verbs.OpSendImm, "KRC_WR_WRITE": verbs.OpWrite,
		"KRC_WR_WRITE_IMM": verbs.OpWriteImm, "KRC_WR_READ": verbs.OpRead,
		"KRC_WR_COMPARE_SWAP": verbs.OpCompareSwap, "KRC_WR_FETCH_ADD": verbs.OpFetchAdd,
		"KRC_ACCESS_LOCAL_WRITE": verbs.AccessLocalWrite, "KRC_ACCESS_REMOTE_WRITE": verbs.AccessRemoteWrite,
		"KRC_ACCESS_REMOTE_READ": verbs.AccessRemoteRead, "KRC_ACCESS_REMOTE_ATOMIC": verbs.AccessRemoteAtomic,
		"KRC_ACCESS_ALL": verbs.AccessAll,
		"KRC_WC_SUCCESS": verbs.Success, "KRC_WC_LOC_PROT_ERR": verbs.LocProtErr, "KRC_WC_WR_FLUSH_ERR": verbs.WRFlushErr,
		"KRC_WC_REM_ACCESS_ERR": verbs.RemAccessErr, "KRC_WC_GENERAL_ERR": verbs.GeneralErr,
		"sizeof.sqe": wire.SQELen, "sizeof.cqe": wire.CQELen, "sizeof.msghdr": wire.MsgHdrLen,
		"ring_size.0": wire.RingSize(0), "ring_size.4000": wire.RingSize(4000), "ring_size.65536": wire.RingSize(65536),
		// the ring Go wrote, read by C
		"sqe.op": verbs.OpCompareSwap, "sqe.flags": wire.FlagUnsignaled, "sqe.imm": uint32(0xdeadbeef), "sqe.mr": 21,
		"sqe.off": 22, "sqe.len": 23, "sqe.region": 24, "sqe.remote_off": 25, "sqe.compare": uint64(1 << 40),
		"sqe.swap": uint64(1<<63 | 7), "cqe.seq": uint64(1<<50 + 3), "cqe.status": verbs.RemAccessErr, "cqe.len": 4096,
		"msg.flags": wire.MsgHasImm, "msg.status": verbs.Success, "msg.len": 5, "msg.imm": 77, "msg.from": 2,
		"msg.port": 9, "msg.data": "hello",
	}
	for s := verbs.Success; s <= verbs.GeneralErr; s++ {
		want[fmt.Sprintf("status.%d", s)] = s.String()
	}
	for i := range wire.ClientMsg + 1 {
		want[fmt.Sprintf("ctr.%d", i)] = 1000 + i
	}
	for k, w := range want {
		ws := fmt.Sprint(w)
		switch v := w.(type) { // print typed constants as numbers
		case wire.Op:
			ws = strconv.Itoa(int(v))
		case verbs.Opcode:
			ws = strconv.Itoa(int(v))
		case verbs.Access:
			ws = strconv.Itoa(int(v))
		case verbs.Status:
			ws = strconv.Itoa(int(v))
		}
		if got[k] != ws {
			t.Errorf("%s: C has %q, Go %q", k, got[k], ws)
		}
	}
	if len(got) != len(want) {
		t.Errorf("C printed %d values, Go checks %d", len(got), len(want))
	}

	// the SQE C wrote, read by Go
	back, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ring, _ = wire.NewRing(back, maxMsg)
	e := ring.GetSQE(9)
	we := wire.SQE{Op: uint8(verbs.OpFetchAdd), Flags: wire.FlagUnsignaled, Imm: 0x01020304, MR: 11, Off: 12,
		Len: 13, Region: 14, RemoteOff: 15, Compare: 0x1111222233334444, Swap: 0x5555666677778888}
	if e != we {
		t.Errorf("SQE written by C, read by Go: %+v, want %+v", e, we)
	}
	if n := ring.Ctr(wire.SQTail).Load(); n != 10 {
		t.Errorf("SQ tail written by C: %d, want 10", n)
	}
}

// TestCExample runs examples/c/krread against a daemon serving node 1 of an
// in-process cluster whose node 2 exports a region: it reads the region;
// told to use an MR of another client, its READ is refused.
func TestCExample(t *testing.T) {
	bin := buildC(t, "examples/c/krread.c")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, srv, sock := startCDaemon(ctx, t)

	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-s", sock}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("krread: %v", err)
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}

	// 1000 READs wrap the 256-entry rings and run out of credits
	out, code := run("-r", "1000", "2", "table")
	t.Logf("krread -r 1000 2 table:\n%s", out)
	if code != 0 || !strings.Contains(out, "1000 READs done") ||
		!strings.Contains(out, `node 2 region "table" (4096 bytes), read 64: hello from node 2`) {
		t.Errorf("krread: exit %d, output:\n%s", code, out)
	}

	// another client's MR: the daemon refuses it, in order, on krread's VQ
	other, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	mr, err := other.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := other.MRID(mr)
	out, code = run("-m", strconv.FormatUint(id, 10), "2", "table")
	t.Logf("krread -m %d 2 table:\n%s", id, out)
	if code != 2 || !strings.Contains(out, "LOC_PROT_ERR") {
		t.Errorf("krread with another client's MR %d: exit %d, output:\n%s", id, code, out)
	}
	if !bytes.Equal(mr.Bytes(), make([]byte, 4096)) {
		t.Error("the other client's MR was written")
	}

	// a region that is not exported: the control call fails with its code
	out, code = run("2", "nope")
	if code != 1 || !strings.Contains(out, "krread: region: krcored:") {
		t.Errorf("krread 2 nope: exit %d, output:\n%s", code, out)
	}

	// every krread detached: the daemon reclaimed them
	deadline := time.Now().Add(5 * time.Second)
	for len(srv.Status().Clients) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(srv.Status().Clients); n != 1 {
		t.Errorf("%d clients attached after krread exited, want 1", n)
	}
}

// startCDaemon starts a two-node in-process cluster whose node 2 exports
// "table" (4 KiB starting "hello from node 2", remote read) and a daemon
// serving node 1 on a temporary socket.
func startCDaemon(ctx context.Context, t *testing.T) (*cluster.Cluster, *daemon.Server, string) {
	t.Helper()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	table, err := c.Node(2).RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(table.Bytes(), "hello from node 2")
	if err := c.Node(2).Export("table", table, 0, 4096, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	t.Cleanup(func() { srv.Close(); <-done }) // before the cluster closes
	return c, srv, sock
}

// TestCMessages: a C client binds a port, posts a receive buffer, exports
// a region to node 2's port, finds a region node 2 exports to its own port
// only as its bound VQ, and SENDs to a port on node 2, which answers twice and then
// WRITE_WITH_IMMs into the region; the first answer lands in the posted
// buffer, the second comes through the message ring, the third is the
// notification (KRC_MSG_WRITE), after the bytes.
func TestCMessages(t *testing.T) {
	bin := buildC(t, "daemon/testdata/krcore_ping.c")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, _, sock := startCDaemon(ctx, t)
	q, err := c.Node(2).Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Bind(80); err != nil {
		t.Fatal(err)
	}
	mr, _ := c.Node(2).RegMR(256, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	q.PushRecv(mr.Range(0, 256))
	if err := c.Node(2).Export("gring", mr, 0, 32, verbs.AccessRemoteRead, krcore.Principal{Node: 1, Port: 7}); err != nil {
		t.Fatal(err)
	}
	replied := make(chan error, 1)
	go func() {
		var m [1]krcore.Message
		if _, err := q.PopMsgsWait(ctx, m[:]); err != nil {
			replied <- err
			return
		}
		if got := string(mr.Bytes()[:m[0].Len]); got != "ping" || m[0].From != 1 || m[0].Port != 7 {
			replied <- fmt.Errorf("node 2 got %+v %q", m[0], got)
			return
		}
		if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: 7}); err != nil {
			replied <- err
			return
		}
		for i, s := range []string{"pong", "late"} {
			copy(mr.Bytes()[200:], s)
			q.Push(ctx, true, krcore.Request{ID: uint64(i), Op: verbs.OpSendImm, Imm: 42, Local: mr.Range(200, 4)})
			var out [1]krcore.Completion
			if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
				replied <- fmt.Errorf("reply %d: %v %v", i, err, out[0].Err())
				return
			}
		}
		g, err := q.Region(ctx, "cring")
		if err != nil {
			replied <- err
			return
		}
		n := copy(mr.Bytes()[200:], "written")
		q.Push(ctx, true, krcore.Request{ID: 2, Op: verbs.OpWriteImm, Imm: 43, Local: mr.Range(200, n), Remote: g.At(0)})
		var out [1]krcore.Completion
		if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			replied <- fmt.Errorf("WRITE_WITH_IMM: %v %v", err, out[0].Err())
			return
		}
		replied <- nil
	}()
	out, err := exec.CommandContext(ctx, bin, sock, "2", "80").CombinedOutput()
	t.Logf("krcore_ping:\n%s", out)
	if err != nil {
		t.Fatalf("krcore_ping: %v", err)
	}
	if err := <-replied; err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gring len 32 access 4", "send seq 1 cqe 1 SUCCESS", "msg 0: in_buf=1 imm=1:42 write=0 from=2 port=80 SUCCESS pong",
		"msg 1: in_buf=0 imm=1:42 write=0 from=2 port=80 SUCCESS late",
		"msg 2: in_buf=0 imm=1:43 write=1 from=2 port=80 SUCCESS written"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("krcore_ping output lacks %q", want)
		}
	}
}
