package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/internal/racekv"
	"github.com/krcore/krcore/meta"
)

// site is the cluster the clients come to: the coordinator's memory nodes
// (nodes 1..K, node 1 with the MetaServer), each serving VQ and raw RC
// clients, and the compute host's krcored (node K+1), a process of its
// own, which daemon clients attach to. Clients are other processes.
type site struct {
	mem    []*liteapp.Node
	tables []*racekv.Node
	rcLns  []net.Listener
	daemon *krcoredProc
	socket string
	dir    string
	fabric fabric // every process's RNIC and RC attributes

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
	nextID krcore.NodeID // the next client's number (and embedded node id)
}

// startSite starts memNodes memory nodes holding a table of keys keys with
// values of value bytes on fab, loads it, and starts krcored's process.
func startSite(ctx context.Context, fab fabric, memNodes, keys, value int, heap int) (_ *site, err error) {
	s := &site{errs: make(chan error, memNodes), fabric: fab}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.dir, err = os.MkdirTemp("", "race-"); err != nil {
		return nil, err
	}
	g := racekv.ForKeys(keys, memNodes, heap)
	var metas []meta.Info
	srvCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for i := range memNodes {
		h, err := fab.startNode(ctx, krcore.NodeID(i+1), metas)
		if err != nil {
			return nil, err
		}
		s.mem = append(s.mem, h)
		if i == 0 {
			metas = []meta.Info{h.MetaInfo()}
		}
		t, err := racekv.NewNode(core.Embed(h.Runtime), g, i)
		if err != nil {
			return nil, err
		}
		s.tables = append(s.tables, t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		s.rcLns = append(s.rcLns, ln)
		s.wg.Go(func() { s.errs <- t.ServeRC(srvCtx, h.Device(), ln, fab.path()) })
	}
	if err := s.load(ctx, keys, value); err != nil {
		return nil, err
	}
	s.socket = filepath.Join(s.dir, "krcored.sock")
	job := krcoredJob{Meta: metas[0].String(), ID: uint64(memNodes + 1), Socket: s.socket, Fabric: fab}
	if s.daemon, err = startKrcored(ctx, job); err != nil {
		return nil, err
	}
	s.nextID = krcore.NodeID(memNodes + 2)
	return s, nil
}

// load puts every key, in place.
func (s *site) load(ctx context.Context, keys, value int) error {
	var mems []racekv.Memory
	for _, t := range s.tables {
		mems = append(mems, t.Local())
	}
	c, err := racekv.Open(ctx, mems)
	if err != nil {
		return err
	}
	val := make([]byte, value)
	for i := range keys {
		copy(val, "loaded")
		if err := c.Put(ctx, keyOf(uint64(i)), val); err != nil {
			return fmt.Errorf("load key %d: %w", i, err)
		}
	}
	return nil
}

// job is a client job of mode against the site, numbered afresh.
func (s *site) job(mode string, keys int) clientJob {
	job := clientJob{Mode: mode, Meta: s.mem[0].MetaInfo().String(), Socket: s.socket, ID: s.nextID, Keys: keys, Fabric: s.fabric}
	s.nextID++
	for i, ln := range s.rcLns {
		job.MemNodes = append(job.MemNodes, uint64(i+1))
		job.RCAddrs = append(job.RCAddrs, ln.Addr().String())
	}
	return job
}

// close stops krcored, the RC listeners and the nodes.
func (s *site) close() error {
	var errs []error
	if s.cancel != nil {
		s.cancel()
	}
	if s.daemon != nil {
		errs = append(errs, s.daemon.stop())
	}
	for _, ln := range s.rcLns {
		ln.Close()
	}
	s.wg.Wait()
	close(s.errs)
	for err := range s.errs {
		errs = append(errs, err)
	}
	for _, t := range s.tables {
		errs = append(errs, t.Close())
	}
	for _, h := range s.mem {
		errs = append(errs, h.Close())
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	return errors.Join(errs...)
}

// selfCommand is a command that runs this executable again with job, as
// JSON, in the environment variable env: which role the process takes.
func selfCommand(ctx context.Context, env string, job any) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	text, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), env+"="+string(text))
	cmd.Stderr = os.Stderr
	return cmd, nil
}

// proc is a client process and the lines it reported.
type proc struct {
	job     clientJob
	cmd     *exec.Cmd
	spawned time.Time
	mu      sync.Mutex
	lines   []string
	boot    chan boot // the boot line, once
	done    chan error
	// killAt, if set, is the number of "call" lines after which the
	// process is killed (SIGKILL): somewhere in its next operation.
	killAt int
}

// spawn starts a client process of this executable for job; killAt, if
// not 0, is proc.killAt.
func spawn(ctx context.Context, job clientJob, killAt int) (*proc, error) {
	cmd, err := selfCommand(ctx, clientEnv, job)
	if err != nil {
		return nil, err
	}
	p := &proc{job: job, cmd: cmd, boot: make(chan boot, 1), done: make(chan error, 1), killAt: killAt}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.spawned = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start client %d: %w", job.ID, err)
	}
	go func() { // ends at the process's exit, which closes the pipe
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 64<<20)
		calls := 0
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "call ") {
				if calls++; calls == p.killAt {
					p.cmd.Process.Kill()
				}
			}
			if rest, ok := strings.CutPrefix(line, "boot "); ok {
				var b boot
				if json.Unmarshal([]byte(rest), &b) == nil {
					p.boot <- b
				}
			}
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
		}
		err := p.cmd.Wait()
		if err != nil {
			err = fmt.Errorf("client %d (%s): %w", job.ID, job.Mode, err)
		}
		p.done <- err
	}()
	return p, nil
}

// wait waits for the process to exit and returns its report lines; it
// can be called again (a cleanup after an error waits for every process).
func (p *proc) wait(ctx context.Context) ([]string, error) {
	select {
	case err := <-p.done:
		p.done <- err
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.lines, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// waitBoot waits for the process's boot line.
func (p *proc) waitBoot(ctx context.Context) (boot, error) {
	select {
	case b := <-p.boot:
		return b, nil
	case err := <-p.done:
		p.done <- err
		return boot{}, fmt.Errorf("client %d exited before its first lookup: %v", p.job.ID, err)
	case <-ctx.Done():
		return boot{}, ctx.Err()
	}
}

// linesOf are the payloads of the lines of kind.
func linesOf(lines []string, kind string) []string {
	var out []string
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, kind+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}
