package meta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/verbs"
)

// ClientConfig configures a Client. The zero value is usable.
type ClientConfig struct {
	// ReadTimeout bounds one table READ; a server that does not answer
	// within it is failed over. Default 500ms.
	ReadTimeout time.Duration
	// RequestTimeout is the first attempt's wait for a UD reply; each
	// retry doubles it (up to 16x). Default 50ms.
	RequestTimeout time.Duration
	// Attempts is how often a UD request is sent before ErrNoReply;
	// default 6.
	Attempts int
	// TornWait bounds how long a torn bucket is read again before
	// ErrTorn; default ReadTimeout. A bucket reads torn while the server
	// rewrites a slot of it, and stays torn for as long as the server's
	// writer is off the CPU mid-copy: on a loaded machine, milliseconds.
	// The first few READs again go at once, then they pause, doubling
	// from 10us to 1ms, so the writer can run.
	TornWait time.Duration
	// MaxInflight bounds concurrent READs per server; default 16.
	MaxInflight int
	// OnRenewError, if set, is called from the renewal goroutine when a
	// lease renewal fails on some server.
	OnRenewError func(node uint64, err error)
	// RCReads makes the client READ tables over RC even on a device with
	// DC, as it must on one without (see Client).
	RCReads bool
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 500 * time.Millisecond
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 50 * time.Millisecond
	}
	if c.Attempts <= 0 {
		c.Attempts = 6
	}
	if c.TornWait <= 0 {
		c.TornWait = c.ReadTimeout
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 16
	}
	return c
}

// ClientStats counts a client's work.
type ClientStats struct {
	Hits          uint64 // Lookups served from the cache
	Misses        uint64 // Lookups that had to Fetch
	Reads         uint64 // table READs posted
	TornReads     uint64 // READs that returned a torn bucket and were repeated
	Failovers     uint64 // Fetches answered by a server other than the first tried
	Recoveries    uint64 // readers (DCIs, RC QPs) replaced after an error
	RenewFailures uint64 // per-server lease renewals that failed
	Connects      uint64 // RC readers connected to servers (no DC: one UD handshake each)
}

// Client reads records from MetaServers and registers its node's record
// with them. It is safe for concurrent use. Each server gets its own reader
// QP and CQ and its own UD endpoint (see conn), all on one PD of the
// client's device. The reader is a DCI, or on a device without DC (or with
// ClientConfig.RCReads, or for a server without a DCT) an RC QP to the
// server, connected by a UD handshake before the first READ and kept: a
// lookup is then one READ either way.
type Client struct {
	cfg   ClientConfig
	dev   verbs.Device
	dc    bool   // READs may go over DC
	id    uint64 // random: names this client's RC readers at the servers
	pd    verbs.PD
	conns []*conn
	reply verbs.Endpoint // this device's port, where replies go (QPN per conn)
	ids   atomic.Uint64
	pref  atomic.Int32 // the server Fetch tries first: the last that answered

	cacheMu sync.RWMutex
	cache   map[uint64]cached

	stats struct {
		hits, misses, reads, torn, failovers, recoveries, renewFailures, connects atomic.Uint64
	}

	opMu   sync.RWMutex // held shared by every call, exclusively by Close
	closed atomic.Bool
	stop   chan struct{}
	ctx    context.Context // the renewals' context, ended by Close
	cancel context.CancelFunc

	regMu sync.Mutex
	regs  map[uint64]*registration
	wg    sync.WaitGroup // renewal goroutines
}

// cached is a record in the cache and when it entered it.
type cached struct {
	rec Record
	at  time.Time // when this content was cached (a refetch of the same record keeps it)
}

// registration is a record this client keeps alive.
type registration struct {
	rec    Record
	lease  time.Duration // as asked
	every  time.Duration // renewal period: a third of the shortest lease granted
	cancel context.CancelFunc
	done   chan struct{}
}

// NewClient creates a client of the given servers on dev. It does not
// talk to them yet: each server's table geometry is fetched on first use
// (or by Hello).
func NewClient(dev verbs.Device, servers []Info, cfg ClientConfig) (*Client, error) {
	if len(servers) == 0 {
		return nil, fmt.Errorf("meta: new client: no servers: %w", ErrBadRecord)
	}
	port := dev.Port()
	if len(port.Addr) > maxReplyAddr {
		return nil, fmt.Errorf("meta: new client: port address of %d bytes, max %d: %w", len(port.Addr), maxReplyAddr, ErrBadRecord)
	}
	c := &Client{
		cfg: cfg.withDefaults(), dev: dev, cache: make(map[uint64]cached), regs: make(map[uint64]*registration),
		reply: verbs.Endpoint{Addr: port.Addr, GID: port.GID, LID: port.LID}, stop: make(chan struct{}),
	}
	c.ids.Store(nonce.Uint64())
	c.dc, c.id = dev.Attr().DCSupported && !c.cfg.RCReads, nonce.Uint64()|1
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var err error
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("meta: new client: %w", err)
	}
	for _, info := range servers {
		sc, err := c.newConn(info)
		if err != nil {
			c.cancel()
			return nil, errors.Join(err, c.release())
		}
		c.conns = append(c.conns, sc)
	}
	return c, nil
}

func (c *Client) nextID() uint64 { return c.ids.Add(1) }

// begin admits a call unless the client is closed; end releases it.
func (c *Client) begin() error {
	c.opMu.RLock()
	if c.closed.Load() {
		c.opMu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (c *Client) end() { c.opMu.RUnlock() }

// Lookup returns node's record from the cache, or Fetches and caches it.
// A record that proves stale (the DC target refuses the key, or no longer
// exists) should be refetched with Fetch.
func (c *Client) Lookup(ctx context.Context, node uint64) (Record, error) {
	if c.closed.Load() {
		return Record{}, ErrClosed
	}
	c.cacheMu.RLock()
	e, ok := c.cache[node]
	c.cacheMu.RUnlock()
	if ok {
		c.stats.hits.Add(1)
		return e.rec, nil
	}
	c.stats.misses.Add(1)
	return c.Fetch(ctx, node)
}

// Fetch reads node's record from a server, bypassing the cache, with one
// RDMA READ of its bucket (more only if the READ raced an update), and
// caches the result. Servers are tried from the one that last answered;
// the first answer, record or ErrNotFound, is final. A ctx already done
// fails it before any READ.
func (c *Client) Fetch(ctx context.Context, node uint64) (Record, error) {
	if node == 0 {
		return Record{}, fmt.Errorf("meta: fetch: %w: node id 0", ErrBadRecord)
	}
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("meta: fetch node %d: %w", node, err)
	}
	if err := c.begin(); err != nil {
		return Record{}, err
	}
	defer c.end()
	rec, err := c.fetch(ctx, node)
	switch {
	case err == nil:
		c.remember(rec)
	case errors.Is(err, ErrNotFound):
		c.Invalidate(node)
		fallthrough
	default:
		err = fmt.Errorf("meta: fetch node %d: %w", node, err)
	}
	return rec, err
}

// remember caches rec, taking the write lock only if it changed: repeated
// Fetches of a stable record from many goroutines then share the read lock.
func (c *Client) remember(rec Record) {
	c.cacheMu.RLock()
	old, ok := c.cache[rec.Node]
	c.cacheMu.RUnlock()
	if ok && old.rec == rec {
		return
	}
	c.cacheMu.Lock()
	c.cache[rec.Node] = cached{rec: rec, at: time.Now()}
	c.cacheMu.Unlock()
}

func (c *Client) fetch(ctx context.Context, node uint64) (Record, error) {
	first := int(c.pref.Load())
	var errs []error
	for i := range c.conns {
		k := (first + i) % len(c.conns)
		rec, err := c.conns[k].fetch(ctx, node)
		if err == nil || errors.Is(err, ErrNotFound) {
			if i > 0 {
				c.stats.failovers.Add(1)
				c.pref.Store(int32(k))
			}
			return rec, err
		}
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return Record{}, err
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return Record{}, errs[0]
	}
	return Record{}, fmt.Errorf("all %d servers failed: %w", len(c.conns), errors.Join(errs...))
}

// Invalidate drops node's cached record, so the next Lookup fetches it.
func (c *Client) Invalidate(node uint64) {
	c.cacheMu.Lock()
	delete(c.cache, node)
	c.cacheMu.Unlock()
}

// CacheEntry is one record in a Client's cache, as Entries reports it:
// what a Lookup of the node returns without a READ. The DC access key is
// left out (Entries is for display).
type CacheEntry struct {
	// Node is the node the record describes.
	Node uint64 `json:"node"`
	// Addr, GID and LID address the node's port (see Record); GID is
	// empty when zero (on the soft fabric).
	Addr string `json:"addr,omitempty"`
	GID  string `json:"gid,omitempty"`
	LID  uint16 `json:"lid,omitempty"`
	// DCTNum is the node's DC target; 0 when it has none (RC only).
	DCTNum uint32 `json:"dct"`
	// CtrlQPN is the node's control UD QP; 0 if it has none.
	CtrlQPN uint32 `json:"ctrl_qpn"`
	// Version is the MetaServer's version of the record.
	Version uint64 `json:"version"`
	// Cached is when this version of the record entered the cache (a
	// refetch that finds it unchanged keeps the time), and Age how long
	// before the snapshot that was.
	Cached time.Time     `json:"cached"`
	Age    time.Duration `json:"age_ns"`
}

// Entries is a snapshot of the cache, one entry per node ordered by node
// id. The cache holds no lease: a record stays until it proves stale or
// the node is invalidated.
func (c *Client) Entries() []CacheEntry {
	now := time.Now()
	c.cacheMu.RLock()
	out := make([]CacheEntry, 0, len(c.cache))
	for _, e := range c.cache {
		r := e.rec
		ce := CacheEntry{Node: r.Node, Addr: r.Addr, LID: r.LID, DCTNum: r.DCTNum, CtrlQPN: r.CtrlQPN,
			Version: r.Version, Cached: e.at, Age: now.Sub(e.at)}
		if r.GID != (verbs.GID{}) {
			ce.GID = r.GID.String()
		}
		out = append(out, ce)
	}
	c.cacheMu.RUnlock()
	slices.SortFunc(out, func(a, b CacheEntry) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// Hello fetches every server's table geometry now rather than on the
// first Fetch, so the first lookup costs one READ. It fails only if no
// server answered.
func (c *Client) Hello(ctx context.Context) error {
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	ok, err := c.each(ctx, "hello", 0, func(ctx context.Context, sc *conn) (time.Duration, error) {
		_, err := sc.geometry(ctx)
		return 0, err
	})
	if ok > 0 {
		return nil
	}
	return err
}

// Register stores rec on every server with the given lease (0: the
// servers' default) and keeps renewing it, every third of the lease, from
// a goroutine the client owns, until Deregister or Close. If only some
// servers accepted it, the renewals keep trying the others and Register
// returns a *PartialError; if none did, nothing is renewed.
func (c *Client) Register(ctx context.Context, rec Record, lease time.Duration) error {
	rec.Version = 0
	if err := rec.Validate(); err != nil {
		return fmt.Errorf("meta: register: %w", err)
	}
	if lease < 0 {
		return fmt.Errorf("meta: register node %d: %w: negative lease %v", rec.Node, ErrBadRecord, lease)
	}
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	c.stopRenewing(rec.Node)
	var mu sync.Mutex
	granted := time.Duration(0)
	ok, err := c.each(ctx, "register", rec.Node, func(ctx context.Context, sc *conn) (time.Duration, error) {
		g, err := sc.register(ctx, rec, lease)
		if err == nil {
			mu.Lock()
			if granted == 0 || g < granted {
				granted = g
			}
			mu.Unlock()
		}
		return g, err
	})
	if ok > 0 {
		c.startRenewing(rec, lease, granted)
	}
	return err
}

// Deregister stops renewing node's record and removes it from every
// server. A server that does not hold it counts as success.
func (c *Client) Deregister(ctx context.Context, node uint64) error {
	if node == 0 {
		return fmt.Errorf("meta: deregister: %w: node id 0", ErrBadRecord)
	}
	if err := c.begin(); err != nil {
		return err
	}
	defer c.end()
	c.stopRenewing(node)
	c.Invalidate(node)
	_, err := c.each(ctx, "deregister", node, func(ctx context.Context, sc *conn) (time.Duration, error) {
		return 0, sc.deregister(ctx, node)
	})
	return err
}

// each runs fn against every server at once and reports how many
// succeeded and an error naming each that failed: a *PartialError when
// some succeeded, a joined error when none did. A ctx already done fails
// it before any request is sent.
func (c *Client) each(ctx context.Context, what string, node uint64, fn func(context.Context, *conn) (time.Duration, error)) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("meta: %s node %d: %w", what, node, err)
	}
	errs := make([]error, len(c.conns))
	if len(c.conns) == 1 {
		_, errs[0] = fn(ctx, c.conns[0])
	} else {
		var wg sync.WaitGroup
		for i, sc := range c.conns {
			wg.Go(func() { _, errs[i] = fn(ctx, sc) })
		}
		wg.Wait()
	}
	pe := &PartialError{Op: what, Node: node}
	for i, err := range errs {
		if err == nil {
			pe.Succeeded++
		} else {
			pe.Failed = append(pe.Failed, ServerError{Server: c.conns[i].info, Err: err})
		}
	}
	switch {
	case len(pe.Failed) == 0:
		return pe.Succeeded, nil
	case pe.Succeeded > 0:
		return pe.Succeeded, pe
	}
	return 0, fmt.Errorf("meta: %s node %d: every server failed: %w", what, node, errors.Join(pe.Unwrap()...))
}

// startRenewing starts the goroutine that keeps rec's lease alive.
func (c *Client) startRenewing(rec Record, lease, granted time.Duration) {
	ctx, cancel := context.WithCancel(c.ctx)
	r := &registration{rec: rec, lease: lease, every: max(granted/3, time.Millisecond), cancel: cancel, done: make(chan struct{})}
	c.regMu.Lock()
	defer c.regMu.Unlock()
	if c.closed.Load() { // Close is past its barrier: it would not wait for us
		cancel()
		return
	}
	if old := c.regs[rec.Node]; old != nil {
		old.cancel() // a concurrent Register of the same node: the last one renews
	}
	c.regs[rec.Node] = r
	c.wg.Add(1)
	go c.renewLoop(ctx, r)
}

// stopRenewing ends node's renewals and waits for the goroutine to exit.
func (c *Client) stopRenewing(node uint64) {
	c.regMu.Lock()
	r := c.regs[node]
	delete(c.regs, node)
	c.regMu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// renewLoop renews r on every server each period. A server that lost the
// record gets it registered again, which also repairs a partial Register.
// Periods run from one renewal's start to the next (a ticker), not from a
// renewal's end: a renewal may take up to a period, and counting the
// period from its end let one slow renewal and one lost one outlast a
// lease of three periods.
func (c *Client) renewLoop(ctx context.Context, r *registration) {
	defer c.wg.Done()
	defer close(r.done)
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, r.every)
		_, err := c.each(rctx, "renew", r.rec.Node, func(ctx context.Context, sc *conn) (time.Duration, error) {
			return sc.renew(ctx, r.rec, r.lease)
		})
		cancel()
		if err != nil && ctx.Err() == nil {
			c.stats.renewFailures.Add(1)
			if c.cfg.OnRenewError != nil {
				c.cfg.OnRenewError(r.rec.Node, err)
			}
		}
	}
}

// Stats reports the client's counters.
func (c *Client) Stats() ClientStats {
	return ClientStats{
		Hits: c.stats.hits.Load(), Misses: c.stats.misses.Load(), Reads: c.stats.reads.Load(),
		TornReads: c.stats.torn.Load(), Failovers: c.stats.failovers.Load(),
		Recoveries: c.stats.recoveries.Load(), RenewFailures: c.stats.renewFailures.Load(),
		Connects: c.stats.connects.Load(),
	}
}

// Close stops renewing (records then lapse with their leases; Deregister
// first to remove them at once), fails calls in flight with ErrClosed and
// releases the client's resources.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return ErrClosed
	}
	close(c.stop)
	c.cancel()
	c.regMu.Lock() // a barrier: no renewal starts after this
	c.regMu.Unlock()
	for _, sc := range c.conns {
		sc.flush()
	}
	c.wg.Wait()
	c.opMu.Lock() // every call has left
	defer c.opMu.Unlock()
	return c.release()
}

// release frees the verbs resources.
func (c *Client) release() error {
	var errs []error
	for _, sc := range c.conns {
		errs = append(errs, sc.close())
	}
	errs = append(errs, c.pd.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("meta: close client: %w", err)
	}
	return nil
}
