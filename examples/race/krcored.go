package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/meta"
)

// krcoredEnv holds the krcored process's job (krcoredJob as JSON): its
// presence makes the process the compute host's krcored.
const krcoredEnv = "RACEKV_KRCORED"

// krcoredJob says which node the host's krcored runs and where it serves.
type krcoredJob struct {
	Meta   string `json:"meta"`
	ID     uint64 `json:"id"`
	Socket string `json:"socket"`
	// Fabric is the RNIC krcored opens and its QPs' attributes.
	Fabric fabric `json:"fabric"`
}

// runKrcored is the krcored process's main, if this process is it: it
// serves until its standard input closes, then exits.
func runKrcored() {
	runRole(krcoredEnv, func(job *krcoredJob) error {
		if err := job.serve(); err != nil {
			return fmt.Errorf("krcored: %w", err)
		}
		return nil
	})
}

// serve brings up the node and krcored on it, says ready, and serves
// until standard input closes.
func (job krcoredJob) serve() error {
	info, err := meta.ParseInfo(job.Meta)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	node, err := job.Fabric.startNode(ctx, krcore.NodeID(job.ID), []meta.Info{info})
	cancel()
	if err != nil {
		return err
	}
	srv, err := daemon.New(node.Runtime, daemon.Config{Socket: job.Socket, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return errors.Join(err, node.Close())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the coordinator closes it
	return errors.Join(srv.Close(), <-served, node.Close())
}

// krcoredProc is the krcored process the coordinator started.
type krcoredProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

// startKrcored starts the host's krcored process for job and waits until
// it serves.
func startKrcored(ctx context.Context, job krcoredJob) (*krcoredProc, error) {
	cmd, err := selfCommand(context.Background(), krcoredEnv, job) // stopped by stop, not by ctx
	if err != nil {
		return nil, err
	}
	k := &krcoredProc{cmd: cmd}
	out, err1 := k.cmd.StdoutPipe()
	in, err2 := k.cmd.StdinPipe()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	k.in = in
	if err := k.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start krcored: %w", err)
	}
	ready := make(chan error, 1)
	go func() { // ends with the line, or when the process exits
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("krcored said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out)
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("krcored did not start: %w", err), k.stop())
	}
	return k, nil
}

// stop closes krcored's standard input, which ends it, and waits for it.
func (k *krcoredProc) stop() error {
	k.in.Close()
	if err := k.cmd.Wait(); err != nil {
		return fmt.Errorf("krcored: %w", err)
	}
	return nil
}
