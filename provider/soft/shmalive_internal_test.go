//go:build linux

package soft

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
)

// aliveChildEnv makes the test binary the child of TestAliveWordMarksDeath.
const aliveChildEnv = "KRCORE_SOFT_ALIVE_CHILD"

// TestAliveWordMarksDeath: a process's alive word in a segment reads alive
// while it runs and dead as soon as it is reaped, with no help from the
// dead process or from this side's link (the kernel marks it); a disarmed
// word reads dead and leaves the robust list.
func TestAliveWordMarksDeath(t *testing.T) {
	if os.Getenv(aliveChildEnv) != "" {
		aliveChild()
		return
	}
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
	cmd := exec.Command(os.Args[0], "-test.run=^TestAliveWordMarksDeath$", "-test.count=1")
	cmd.Env = append(os.Environ(), aliveChildEnv+"=1")
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(blk.FD()), "seg")}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
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
