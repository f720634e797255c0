package remotedev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// ChildEnv is the environment variable through which StartChild tells the
// child which file descriptor is its end of the connection. A program (or a
// test binary's TestMain) that finds it set should serve a device on
// ChildConn and exit.
const ChildEnv = "KRCORE_REMOTE_FD"

// reapTimeout bounds how long Stop and Kill wait for the child to exit.
const reapTimeout = 10 * time.Second

// Child is a server process started by StartChild and the Client connected
// to the device it serves.
type Child struct {
	// Client is the proxied device.
	Client *Client

	cmd     *exec.Cmd
	killed  atomic.Bool   // Kill was called: a SIGKILL exit is expected
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // the process's exit status; read after exited
}

// StartChild starts cmd as a server, connected over a Unix socketpair whose
// child end is passed as an extra file named by ChildEnv, and returns the
// connected Client. The child must serve a device on ChildConn. ctx bounds
// the start and the hello exchange. The caller must Stop or Kill the child.
func StartChild(ctx context.Context, cmd *exec.Cmd, opt Options) (*Child, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("remote: socketpair: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "remote-parent"), os.NewFile(uintptr(fds[1]), "remote-child")
	defer mine.Close()
	cmd.ExtraFiles = append(cmd.ExtraFiles, theirs)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, ChildEnv+"="+strconv.Itoa(2+len(cmd.ExtraFiles)))
	err = cmd.Start()
	theirs.Close() // the child has its copy; ours would hide the child's exit
	if err != nil {
		return nil, fmt.Errorf("remote: start %s: %w", cmd.Path, err)
	}
	ch := &Child{cmd: cmd, exited: make(chan struct{})}
	go ch.reap()
	conn, err := net.FileConn(mine)
	if err == nil {
		ch.Client, err = NewClient(ctx, conn, opt)
	}
	if err != nil {
		ch.Kill()
		return nil, fmt.Errorf("remote: connect to child %d: %w", cmd.Process.Pid, err)
	}
	return ch, nil
}

// reap is owned by the Child: it ends when the process exits, which Kill
// guarantees.
func (ch *Child) reap() {
	ch.waitErr = ch.cmd.Wait()
	close(ch.exited)
}

// PID is the child's process ID.
func (ch *Child) PID() int { return ch.cmd.Process.Pid }

// Exited is closed once the child has exited and been reaped.
func (ch *Child) Exited() <-chan struct{} { return ch.exited }

// Stop closes the device (which makes a well-behaved child exit), waits for
// the child until ctx ends or reapTimeout passes, and kills it if it has
// not exited by then. It returns the device's Close error or the child's
// exit error (none after Kill).
func (ch *Child) Stop(ctx context.Context) error {
	closeErr := ch.Client.Close()
	ctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	select {
	case <-ch.exited:
	case <-ctx.Done():
		ch.Kill()
		return fmt.Errorf("remote: child %d did not exit: %w", ch.PID(), ctx.Err())
	}
	if ch.waitErr != nil && !ch.killed.Load() {
		return fmt.Errorf("remote: child %d: %w", ch.PID(), ch.waitErr)
	}
	return closeErr
}

// Kill kills the child with SIGKILL and waits for it to be reaped; the
// Client's calls then fail with verbs.ErrClosed. Killing a child that has
// exited is a no-op.
func (ch *Child) Kill() error {
	ch.killed.Store(true)
	err := ch.cmd.Process.Kill()
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	select {
	case <-ch.exited:
	case <-time.After(reapTimeout):
		return fmt.Errorf("remote: child %d not reaped %v after SIGKILL", ch.PID(), reapTimeout)
	}
	if ch.Client != nil {
		ch.Client.shutdown()
	}
	return err
}

// ChildConn returns the connection StartChild passed to this process, or an
// error if it was not started that way.
func ChildConn() (net.Conn, error) {
	v := os.Getenv(ChildEnv)
	if v == "" {
		return nil, fmt.Errorf("remote: %s not set: not started by StartChild", ChildEnv)
	}
	os.Unsetenv(ChildEnv) // our own children must not take it for theirs
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("remote: %s=%q is not a file descriptor", ChildEnv, v)
	}
	f := os.NewFile(uintptr(fd), "remote-conn")
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("remote: connection on fd %d: %w", fd, err)
	}
	return conn, nil
}
