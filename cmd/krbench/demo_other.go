//go:build !linux

package main

import "os/exec"

// setChildAttrs has no portable parent-death signal outside Linux; the
// demo's own cancellation stops the child.
func setChildAttrs(cmd *exec.Cmd) {}
