//go:build linux

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/offheap"
	"golang.org/x/sys/unix"
)

// ErrDenied reports a peer that Config.AllowUIDs/AllowGIDs refuse.
var ErrDenied = errors.New("daemon: peer not allowed")

// ErrNotSocket reports a Config.Socket path that names something other
// than a socket: New refuses it rather than replace it.
var ErrNotSocket = errors.New("daemon: not a socket")

// Config configures a Server.
type Config struct {
	// Socket is the Unix socket path; default wire.DefaultSocket().
	Socket string `json:"socket"`
	// Group, if set, owns the socket (mode 0660), so its members may attach.
	Group string `json:"group"`
	// AllowUIDs and AllowGIDs, when not empty, admit only peers whose
	// SO_PEERCRED uid (or gid) is listed.
	AllowUIDs []uint32 `json:"allow_uids"`
	AllowGIDs []uint32 `json:"allow_gids"`
	// MaxVQs and MaxMRBytes bound one client; defaults 64 and 1 GiB.
	MaxVQs     int   `json:"max_vqs"`
	MaxMRBytes int64 `json:"max_mr_bytes"`
	// ClientCredits bounds one client's requests in flight over all its
	// VQs (each VQ also has the runtime's per-VQ credits), so a client
	// cannot fill the shared QPs' queues ahead of the others; default 256.
	ClientCredits int `json:"client_credits"`
	// Spin is how long a client's pump polls its rings and the completion
	// queue before it sleeps; 0 (the default) leaves it to the runtime's
	// adaptive spin of a few microseconds. Spinning lowers latency and
	// costs a core while the client is idle. A spin ends early when the
	// client sleeps on a VQ the pump last worked on (see clientAsleep).
	Spin time.Duration `json:"spin"`
	// ShareQuantum is how long a client's pump may work without a break
	// while another client is interactive (its pump sleeps between its
	// requests); then it sleeps three times as long, so a flood leaves a core
	// free for the others' wake-ups (see pump.share). Default
	// DefaultShareQuantum on a node of at most 4 CPUs, where a flood and
	// its pump fill the cores, and off on larger ones; negative: off.
	ShareQuantum time.Duration `json:"share_quantum"`
	// CallTimeout bounds a control request that talks to other nodes
	// (Connect, Region); default 5s.
	CallTimeout time.Duration `json:"call_timeout"`
	// SendTimeout bounds a message's wait for room in a client's socket;
	// default 5s. Only a client that leaves its replies unread fills the
	// socket: past the bound the daemon drops it and reclaims what it
	// owned, instead of leaving the goroutine that answers it (and Close,
	// whose goodbye waits behind that answer) blocked for good. A client
	// that reads its socket rarely (a process stopped under a debugger, a
	// slow link through a proxy) needs a longer bound.
	SendTimeout time.Duration `json:"send_timeout"`
	// Logger receives the daemon's events; default slog.Default().
	Logger *slog.Logger `json:"-"`
}

// DefaultShareQuantum is Config.ShareQuantum's default on small nodes: on
// 2 cores a client's p99 beside a flood rose 1.5-1.8x with it, 11-21x
// without (TestFloodFairness); a 200us quantum let it rise 4.5-8x, and
// naps as long as the work (not three times) 1.4-2.3x.
const DefaultShareQuantum = 50 * time.Microsecond

// Server serves one runtime to the processes of the node.
type Server struct {
	rt    *core.Runtime
	cfg   Config
	log   *slog.Logger
	ln    *net.UnixListener
	start time.Time

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ids      atomic.Uint64 // every client, MR, region and VQ id
	mu       sync.Mutex
	sessions map[uint64]*session
	closed   bool

	attached, reclaimed, denied atomic.Uint64

	pumps atomic.Pointer[[]*pump] // every session's, for nudge; copied on change

	metrics *metrics

	// stranded holds the memory of MRs the runtime could not deregister
	// yet (see memory.release): mapped until the daemon exits.
	stranded []*offheap.Block
}

// strand keeps blk mapped for good.
func (s *Server) strand(blk *offheap.Block) {
	s.mu.Lock()
	s.stranded = append(s.stranded, blk)
	s.mu.Unlock()
	s.log.Warn("MR still in use after deregistration: its memory stays mapped", "bytes", len(blk.Bytes()))
}

// clock is the time since the server started, in ns: a monotonic clock
// that fits an atomic.Int64.
func (s *Server) clock() int64 { return int64(time.Since(s.start)) }

// New listens on cfg.Socket for clients of rt. The caller runs Serve and
// closes rt after Close.
func New(rt *core.Runtime, cfg Config) (*Server, error) {
	if cfg.Socket == "" {
		cfg.Socket = wire.DefaultSocket()
	}
	if cfg.MaxVQs <= 0 {
		cfg.MaxVQs = 64
	}
	if cfg.MaxMRBytes <= 0 {
		cfg.MaxMRBytes = 1 << 30
	}
	if cfg.ClientCredits <= 0 {
		cfg.ClientCredits = 256
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 5 * time.Second
	}
	if cfg.ShareQuantum == 0 && runtime.NumCPU() <= 4 {
		cfg.ShareQuantum = DefaultShareQuantum
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := listen(cfg.Socket, cfg.Group)
	if err != nil {
		return nil, err
	}
	s := &Server{rt: rt, cfg: cfg, log: cfg.Logger, ln: ln, start: time.Now(), sessions: make(map[uint64]*session)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	return s, nil
}

// listen makes the socket, replacing a stale one, with mode 0660 and the
// group given.
func listen(path, group string) (*net.UnixListener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("daemon: listen: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: chmod %s: %w", path, err)
	}
	if group == "" {
		return ln, nil
	}
	g, err := user.LookupGroup(group)
	if err == nil {
		var gid int
		if gid, err = strconv.Atoi(g.Gid); err == nil {
			err = os.Chown(path, -1, gid)
		}
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: socket group %q: %w", group, err)
	}
	return ln, nil
}

// removeStale removes the socket at path if no daemon serves it. Anything
// at path but a socket (a file, a directory, a symbolic link) is the
// user's, and an error.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("daemon: socket %s: %w", path, err)
	case fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("daemon: socket %s: %w (%v): remove it or choose another path", path, ErrNotSocket, fi.Mode().Type())
	}
	if c, err := net.Dial("unixpacket", path); err == nil {
		c.Close()
		return fmt.Errorf("daemon: %s: another krcored is serving: %w", path, krcore.ErrPortInUse)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("daemon: remove stale socket %s: %w", path, err)
	}
	return nil
}

// Socket is the path the server listens on.
func (s *Server) Socket() string { return s.cfg.Socket }

// Serve accepts clients until Close (or ctx ends, which closes the server).
// Running out of descriptors or memory makes it wait and accept again
// (see acceptBackoff): a user holding many connections open delays the
// next client, and does not stop the daemon.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	var wait time.Duration
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			if wait = acceptBackoff(err, wait); wait == 0 {
				return fmt.Errorf("daemon: accept: %w", err)
			}
			s.log.Warn("accept: waiting to accept again", "err", err, "wait", wait)
			if !s.sleep(wait) {
				return nil
			}
			continue
		}
		wait = 0
		s.admit(c)
	}
}

// acceptBackoff is how long to wait after accept failed with err, having
// waited last (0: first failure), or 0 if err is not one that passes: out
// of descriptors or memory, or a connection aborted before it was taken.
func acceptBackoff(err error, last time.Duration) time.Duration {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.ECONNABORTED} {
		if errors.Is(err, e) {
			return min(max(2*last, 5*time.Millisecond), time.Second)
		}
	}
	return 0
}

// sleep waits d, or until Close; it reports false on Close.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// admit checks the peer's credentials and starts its session.
func (s *Server) admit(c *net.UnixConn) {
	cred, err := peerCred(c)
	if err == nil && !s.allowed(cred) {
		err = fmt.Errorf("uid %d gid %d: %w", cred.Uid, cred.Gid, ErrDenied)
	}
	if err != nil {
		s.denied.Add(1)
		s.log.Warn("client refused", "err", err)
		c.Close()
		return
	}
	ss := newSession(s, c, cred)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.sessions[ss.id] = ss
	s.publishPumps()
	s.mu.Unlock()
	s.attached.Add(1)
	s.log.Info("client attached", "client", ss.id, "pid", cred.Pid, "uid", cred.Uid, "gid", cred.Gid)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ss.serve()
		s.mu.Lock()
		delete(s.sessions, ss.id)
		s.metrics.retire(ss)
		s.publishPumps()
		s.mu.Unlock()
		s.reclaimed.Add(1)
	}()
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: SO_PEERCRED: %w", err)
	}
	return cred, nil
}

func (s *Server) allowed(c *unix.Ucred) bool {
	if len(s.cfg.AllowUIDs) == 0 && len(s.cfg.AllowGIDs) == 0 {
		return true
	}
	return slices.Contains(s.cfg.AllowUIDs, c.Uid) || slices.Contains(s.cfg.AllowGIDs, c.Gid)
}

// Close stops accepting, tells every client goodbye and reclaims them all.
// It does not close the runtime.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("daemon: %w", krcore.ErrClosed)
	}
	s.closed = true
	ss := make([]*session, 0, len(s.sessions))
	for _, x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	s.cancel()
	err := s.ln.Close()
	for _, x := range ss {
		x.bye("krcored is shutting down")
	}
	s.wg.Wait()
	return err
}
