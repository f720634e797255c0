//go:build linux

package soft

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krcore/krcore/offheap"
)

// aliveChildEnv makes the test binary the child of TestAliveWordMarksDeath.
const aliveChildEnv = "KRCORE_SOFT_ALIVE_CHILD"

// TestAliveWordMarksDeath: a process's alive word in a segment reads alive
// while it runs and dead as soon as it is reaped, with no help from the
// dead process or from this side's link (the kernel marks it); a disarmed
// word reads dead and leaves the robust list.
//
// It closes no descriptor it does not own: a stray close of one, when its
// garbage is collected, closes whatever file took the number meanwhile (a
// later test's shared-memory link socket, whose reader then waited on a
// descriptor no longer open, and its node's Close forever).
func TestAliveWordMarksDeath(t *testing.T) {
	if os.Getenv(aliveChildEnv) != "" {
		aliveChild()
		return
	}
	checkAliveWord(t)
	descriptorsSurviveGC(t)
}

func checkAliveWord(t *testing.T) {
	blk, err := offheap.AllocShared("alive-test", shmSegSize)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	seg, err := mapSeg(blk, true)
	if err != nil {
		t.Fatal(err)
	}
	seg.armAlive(0)
	if !seg.peerAlive(0) {
		t.Fatal("this process's own word reads dead")
	}
	cmd, out := startAliveChild(t, blk)
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "armed" {
		t.Fatalf("child: %q %v", sc.Text(), sc.Err())
	}
	if !seg.peerAlive(1) {
		t.Fatalf("a running child's word reads dead: %#x", seg.aliveWord(1).Load())
	}
	cmd.Process.Kill()
	cmd.Wait()
	if seg.peerAlive(1) {
		t.Fatalf("a reaped child's word reads alive: %#x", seg.aliveWord(1).Load())
	}
	seg.disarmAlive(0)
	if seg.peerAlive(0) {
		t.Fatal("a disarmed word reads alive")
	}
	alive.mu.Lock()
	n := len(alive.entries)
	alive.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d entries left in the robust list", n)
	}
}

// startAliveChild starts the test binary as TestAliveWordMarksDeath's
// child with blk's memfd as its descriptor 3, and returns it and its
// standard output. The child gets a duplicate, closed here once the child
// has it: an os.File on blk's own descriptor would close it a second time,
// after blk.Close, when the file is collected.
func startAliveChild(t *testing.T, blk *offheap.Block) (*exec.Cmd, io.Reader) {
	fd, err := unix.Dup(blk.FD())
	if err != nil {
		t.Fatal(err)
	}
	seg := os.NewFile(uintptr(fd), "seg")
	defer seg.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAliveWordMarksDeath$", "-test.count=1")
	cmd.Env = append(os.Environ(), aliveChildEnv+"=1")
	cmd.ExtraFiles = []*os.File{seg}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// descriptorsSurviveGC checks that collecting the garbage of what ran
// before closes no descriptor: it takes the lowest free numbers (those
// the files dropped had) with a pipe, runs the finalizers of the garbage,
// and the pipe must still be open. A finalizer that has not run by then
// goes unchecked; one that closes a stray descriptor fails the check.
func descriptorsSurviveGC(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		runFinalizers()
	}
	for _, fd := range p {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d, opened after the test, was closed under its owner when garbage was collected: %v", fd, err)
			continue
		}
		unix.Close(fd)
	}
}

// runFinalizers collects garbage and waits (up to a bound that only stops
// a hang) for a finalizer queued by that collection to run.
func runFinalizers() {
	type sentinel struct{ p *int }
	done := make(chan struct{})
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) { close(done) })
	runtime.GC()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// aliveChild maps the segment passed as descriptor 3, arms side 1 and
// waits to be killed.
func aliveChild() {
	blk, err := offheap.Open(3, shmSegSize)
	if err != nil {
		os.Exit(2)
	}
	seg, err := mapSeg(blk, false)
	if err != nil {
		os.Exit(3)
	}
	seg.armAlive(1)
	os.Stdout.WriteString("armed\n")
	time.Sleep(time.Minute)
	os.Exit(0)
}
