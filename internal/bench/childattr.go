//go:build linux

package bench

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the kernel kill the server child if the demo dies
// without cleaning up (SIGKILL, a crash): a stray server would hold its
// port and a core.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
