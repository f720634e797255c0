// Package scale is krcore's scale run (issue 18 §4): a cluster of N nodes
// (1,000 to 10,000) joined through etcd and a MetaServer mirroring it, on
// one machine, measured at each N in DC mode and in RC-only mode.
//
// # What runs, and what stands in
//
// A full runtime per node (a soft RNIC, its QPs, buffers and goroutines)
// is too heavy for 10,000 on 2 cores, so the run is a model, with every
// part whose cost grows with N real:
//
//   - etcd: one embedded member on loopback (the etcd server module, as
//     meta/etcdstore's tests run it, with fsync off), holding every node's
//     record under a lease of its own (etcdstore.Store.Register).
//   - the MetaServer: a meta.Server mirroring the store into its
//     READ-able table, started anew at each N with a table sized for it,
//     so the rebuild from etcd is timed too.
//   - Sample nodes (128 by default) are full runtimes (core.New on soft
//     RNICs of one in-memory fabric) joining through etcd; they are the
//     ones measured: QPs per node, memory per node, and each connects to
//     Peers random others.
//   - The other N - Sample nodes stand in: their records are registered in
//     etcd (and so mirrored into the table) like any node's, naming the
//     DC target of one running "host" runtime, but no runtime runs for
//     them. A DC connect reads only the MetaServer, so connecting to a
//     stand-in costs what connecting to a running node costs. An RC
//     connect needs the peer's runtime to answer, so in RC-only mode the
//     sample connects among itself.
//
// Then Join nodes join at once: JoinFull full runtimes (their join timed,
// core.New: register in etcd, wait until the MetaServer serves the record)
// and the rest stand-ins, registered concurrently; the time until the
// table holds them all is reported, and the sample connects to some of
// them.
//
// # Settings that differ from a deployment's, and why
//
// etcd runs without fsync and every lease is 10 minutes (keep-alives stay
// out of the measurement); the MetaServers' tables have at least 2 buckets
// per node, 8 slots each (meta.TableFor: the stages' through
// meta.ServerConfig, the host's embedded one through core.Config's
// MetaBuckets and MetaSlots); the runtimes have small queues
// and run their pool policy every second (runtimeConfig); the soft RNICs
// wait 30 s for a response; a connect that fails is retried twice, its
// time counted whole (Stage.Retried says how many were); 8 nodes connect
// at a time (maxConnectors). Each is there because 200 runtimes, etcd and
// the MetaServer share one process on 2 cores shared with other work.
package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/meta/etcdstore"
	"github.com/krcore/krcore/provider/soft"
)

// Modes of the run.
const (
	ModeDC = "dc"      // the runtime's default: DC targets and initiators, RC for hot peers
	ModeRC = "rc-only" // core.Config.RCOnly: an RC QP per peer
)

// Config shapes a run.
type Config struct {
	Sizes    []int    // cluster sizes, ascending
	Modes    []string // ModeDC, ModeRC
	Peers    int      // connects per sample node
	Sample   int      // full runtimes measured at each size
	Join     int      // nodes joining at once after the connects
	JoinFull int      // of Join, full runtimes (the rest stand in)
	Reads    int      // MetaServer READs timed at each size
	Workers  int      // concurrent registrations while growing the cluster
	Log      io.Writer
}

// DefaultConfig is the run: 1k, 2k, 5k and 10k nodes, 100 peers
// each, then 1,000 joining at once.
func DefaultConfig() Config {
	return Config{Sizes: []int{1000, 2000, 5000, 10000}, Modes: []string{ModeDC, ModeRC}, Peers: 100,
		Sample: 128, Join: 1000, JoinFull: 64, Reads: 2000, Workers: 32, Log: io.Discard}
}

// Check refuses a config the run cannot do.
func (c Config) Check() error {
	switch {
	case len(c.Sizes) == 0 || !slices.IsSorted(c.Sizes) || c.Sizes[0] < c.Sample+1:
		return fmt.Errorf("scale: sizes %v: want ascending, each above the sample (%d)", c.Sizes, c.Sample)
	case c.Peers < 1 || c.Sample < 2 || c.JoinFull < 0 || c.Join < c.JoinFull || c.Reads < 1 || c.Workers < 1:
		return fmt.Errorf("scale: peers %d, sample %d, join %d (full %d), reads %d, workers %d: out of range",
			c.Peers, c.Sample, c.Join, c.JoinFull, c.Reads, c.Workers)
	}
	for _, m := range c.Modes {
		if m != ModeDC && m != ModeRC {
			return fmt.Errorf("scale: mode %q: want %s or %s", m, ModeDC, ModeRC)
		}
	}
	return nil
}

// Stage is one mode at one size: what the run measured.
type Stage struct {
	Mode string
	N    int // nodes registered when the sample connected

	Grow    time.Duration // registering the stand-ins added to reach N
	Added   int
	Rebuild time.Duration // a new MetaServer mirroring N records from etcd

	Buckets, Slots, TableBytes int
	Unplaced                   uint64 // records that found their bucket full
	ReadBytes                  int    // bytes one lookup READs
	Read                       Percentiles

	Join     Percentiles // a sample node's join (core.New), 4 at a time
	Connect  Percentiles // the sample's connects to Peers random nodes each
	Connects int
	Retried  int     // connects (of both kinds) that needed a retry
	QPs      Spread  // QPs on a sample node's RNIC after its connects
	HeapB    float64 // Go heap per sample node after its connects (bytes)

	Joined         int           // nodes that joined at once
	JoinFailed     int           // full runtimes (sample or storm) that gave up joining
	JoinFull       Percentiles   // a full runtime's join in the storm (core.New)
	JoinAll        time.Duration // storm start until the table holds every joiner
	JoinConnect    Percentiles   // the sample's connects to joiners after the storm
	JoinConnectsTo int
}

// Percentiles of a series of durations.
type Percentiles struct{ P50, P99, Max time.Duration }

// Spread of a count over nodes.
type Spread struct{ Mean, Max float64 }

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return Percentiles{P50: at(0.50), P99: at(0.99), Max: d[len(d)-1]}
}

// Run runs every mode of cfg at every size and returns the stages in
// order; dir holds etcd's data.
func Run(ctx context.Context, cfg Config, dir string) ([]Stage, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	etcd, endpoint, err := startEtcd(dir)
	if err != nil {
		return nil, err
	}
	defer etcd.Close()
	var out []Stage
	for _, mode := range cfg.Modes {
		stages, err := runMode(ctx, cfg, mode, endpoint)
		out = append(out, stages...)
		if err != nil {
			return out, fmt.Errorf("%s: %w", mode, err)
		}
	}
	return out, nil
}

// startEtcd starts one etcd member on loopback with its data in dir.
// fsync is off: the run measures krcore at scale, not the disk.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "scale", dir
	peer, _ := url.Parse("http://127.0.0.1:0")
	client, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.InitialCluster = "scale=" + peer.String()
	cfg.UnsafeNoFsync = true
	// One member elects no one, but etcd times a request out at 5 s plus
	// two election timeouts; a starved process needs more.
	cfg.TickMs, cfg.ElectionMs = 1000, 10000
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd not ready within 30s")
	}
	return e, e.Clients[0].Addr().String(), nil
}

// lease is every registration's: long, so that keep-alives stay out of
// the measurement (they are etcd's and rare).
const lease = 10 * time.Minute

// cluster is one mode's run: the fabric, the store, the host whose DC
// target the stand-ins name, and the ids handed out.
type cluster struct {
	cfg      Config
	mode     string
	fabric   *soft.Fabric
	store    *etcdstore.Store
	host     *node // embeds the bootstrap MetaServer (core.Config.MetaBuckets)
	template meta.Record
	nextID   atomic.Uint64
	mu       sync.Mutex
	standins []krcore.NodeID // registered, never withdrawn
	live     int             // records in the store
}

// node is a full runtime on its own soft RNIC.
type node struct {
	dev *soft.Node
	rt  *core.Runtime
}

func (n *node) close() {
	n.rt.Close()
	n.dev.Close()
}

func runMode(ctx context.Context, cfg Config, mode, endpoint string) ([]Stage, error) {
	store, err := etcdstore.New(etcdstore.Config{Endpoints: []string{endpoint}, Prefix: "/krcore-scale/" + mode + "/"})
	if err != nil {
		return nil, err
	}
	c := &cluster{cfg: cfg, mode: mode, fabric: soft.NewFabric(), store: store}
	defer c.close()
	if err := c.startHost(ctx); err != nil {
		return nil, err
	}
	var out []Stage
	for _, n := range cfg.Sizes {
		st, err := c.stage(ctx, n)
		if err != nil {
			return out, fmt.Errorf("%d nodes: %w", n, err)
		}
		out = append(out, st)
		fmt.Fprintf(cfg.Log, "%s\n", st.Line())
	}
	return out, nil
}

func (c *cluster) close() {
	if c.host != nil {
		c.host.close()
	}
	c.store.Close() // the stand-ins' leases lapse with the run's etcd
}

// serverConfig is a MetaServer's for n records, its table sized by
// meta.TableFor (a record whose bucket is full is not served:
// Stage.Unplaced).
func (c *cluster) serverConfig(n int) meta.ServerConfig {
	b, s := meta.TableFor(n)
	return meta.ServerConfig{Buckets: b, Slots: s, Membership: c.store, NoDC: c.mode == ModeRC, MaxReaders: 4 * (c.cfg.Sample + c.cfg.Join)}
}

// runtimeConfig is a full node's: an embedded MetaServer (metas empty)
// with a table for the largest N and the join (meta.TableFor); small queues and receive buffers (the
// run sends no messages), room for an RC QP to every peer in RC-only mode
// (so that none is evicted while measured), and the pool policy run every
// second instead of every 10 ms at the same hot-peer rate: a node of a
// real cluster wakes 100 times a second on a CPU of its own, but 200
// runtimes in one process on 2 shared cores would wake 20,000 times.
func (c *cluster) runtimeConfig(dev *soft.Node, id uint64, metas []meta.Info) core.Config {
	cfg := core.Config{Device: dev, Node: krcore.NodeID(id), Meta: metas, Membership: c.store, Lease: lease,
		DCIs: 2, RecvSlots: 64, MaxMessage: 1024, Depth: 64, Credits: 32,
		RCOnly: c.mode == ModeRC, RCPeers: 4 * c.cfg.Peers, HotWindow: time.Second, HotOps: 100 * 4096,
		Logger: slog.New(slog.DiscardHandler)}
	if len(metas) == 0 {
		cfg.MetaBuckets, cfg.MetaSlots = meta.TableFor(c.cfg.Sizes[len(c.cfg.Sizes)-1] + c.cfg.Join)
	}
	return cfg
}

// retryTimeout is every device's: a request's response may wait this
// long before the request fails. Long, because on 2 shared cores a
// process may get little CPU for seconds, and a timed-out connect would
// fail the run rather than show as a slow one.
const retryTimeout = 30 * time.Second

// device is a new soft RNIC on the run's fabric.
func (c *cluster) device(name string) (*soft.Node, error) {
	return c.fabric.NewNode(soft.Config{Name: "scale-" + c.mode + "-" + name, RetryTimeout: retryTimeout})
}

// startNode starts a full runtime reading metas (none: embedding a
// MetaServer).
func (c *cluster) startNode(ctx context.Context, metas []meta.Info) (*node, error) {
	id := c.nextID.Add(1)
	dev, err := c.device(fmt.Sprintf("%d", id))
	if err != nil {
		return nil, err
	}
	rt, err := core.New(ctx, c.runtimeConfig(dev, id, metas))
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("node %d: %w", id, err)
	}
	return &node{dev: dev, rt: rt}, nil
}

// startHost starts the host runtime, whose embedded MetaServer mirrors
// the store with a table sized (core.Config.MetaBuckets, MetaSlots) for the
// largest N, and takes the host's record as the stand-ins' template.
func (c *cluster) startHost(ctx context.Context) error {
	var err error
	if c.host, err = c.startNode(ctx, nil); err != nil {
		return err
	}
	c.live = 1
	obs, err := c.observer(c.host.rt.MetaInfo())
	if err != nil {
		return err
	}
	defer obs.close()
	c.template, err = obs.cli.Fetch(ctx, uint64(c.host.rt.Node()))
	return err
}

// observer is a MetaServer client on a device of its own: the READs the
// run times.
type observer struct {
	dev *soft.Node
	cli *meta.Client
}

func (c *cluster) observer(info meta.Info) (*observer, error) {
	dev, err := c.device(fmt.Sprintf("obs-%d", c.nextID.Add(1)))
	if err != nil {
		return nil, err
	}
	cli, err := meta.NewClient(dev, []meta.Info{info}, meta.ClientConfig{RCReads: c.mode == ModeRC})
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &observer{dev: dev, cli: cli}, nil
}

func (o *observer) close() {
	o.cli.Close()
	o.dev.Close()
}

// registerStandins registers k stand-ins, Workers at a time (all at once
// with workers k), and returns their ids.
func (c *cluster) registerStandins(ctx context.Context, k, workers int) ([]krcore.NodeID, error) {
	ids := make([]uint64, k)
	for i := range ids {
		ids[i] = c.nextID.Add(1)
	}
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= k || ctx.Err() != nil {
					return
				}
				rec := c.template
				rec.Node = ids[i]
				// The lease stays kept until the store closes: a stand-in
				// never leaves.
				if _, err := c.store.Register(ctx, rec, lease); err != nil {
					errs[w] = fmt.Errorf("register stand-in %d: %w", rec.Node, err)
					return
				}
				c.mu.Lock()
				c.standins = append(c.standins, krcore.NodeID(rec.Node))
				c.live++
				c.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// stage grows the cluster to n and measures it.
func (c *cluster) stage(ctx context.Context, n int) (Stage, error) {
	st := Stage{Mode: c.mode, N: n}
	t0 := time.Now()
	add := n - c.cfg.Sample - c.live
	standins, err := c.registerStandins(ctx, max(add, 0), c.cfg.Workers)
	if err != nil {
		return st, err
	}
	st.Grow, st.Added = time.Since(t0), len(standins)
	scfg := c.serverConfig(n + c.cfg.Join)
	srv, rebuild, err := c.mirror(ctx, scfg, c.live)
	if err != nil {
		return st, err
	}
	defer srv.close()
	st.Rebuild, st.Buckets, st.Slots = rebuild, scfg.Buckets, scfg.Slots
	st.TableBytes, st.ReadBytes = scfg.Buckets*scfg.Slots*meta.SlotSize, scfg.Slots*meta.SlotSize
	metas := []meta.Info{srv.Info()}

	heap0 := heapInUse()
	sample, took, failed := c.startTimed(ctx, c.cfg.Sample, 4, metas)
	defer c.retire(sample)
	st.JoinFailed = len(failed)
	if len(failed) > 0 {
		fmt.Fprintf(c.cfg.Log, "%s N=%d: %d of %d sample runtimes failed to join, first: %v\n", c.mode, n, len(failed), c.cfg.Sample, failed[0])
	}
	if len(sample) < 2 {
		return st, errors.Join(failed...)
	}
	st.Join = percentiles(took)
	st.N = c.live
	targets := c.targets(sample)
	lat, retried, err := connectAll(ctx, sample, targets, c.cfg.Peers, c.connectors(len(sample)))
	st.Retried += retried
	if err != nil {
		return st, err
	}
	st.Connect, st.Connects = percentiles(lat), len(lat)
	st.HeapB = (float64(heapInUse()) - float64(heap0)) / float64(len(sample))
	st.QPs = qpSpread(sample)
	if st.Read, err = c.reads(ctx, srv.Info(), c.cfg.Reads); err != nil {
		return st, err
	}
	err = c.storm(ctx, &st, srv.Server, metas, sample)
	st.Unplaced = srv.Stats().Unplaced
	return st, err
}

// mirrorServer is a stage's MetaServer on a device of its own.
type mirrorServer struct {
	*meta.Server
	dev *soft.Node
}

// close stops the server, then its device.
func (m *mirrorServer) close() {
	m.Close()
	m.dev.Close()
}

// mirror starts a MetaServer of scfg on a device of its own and waits
// until its table holds want records.
func (c *cluster) mirror(ctx context.Context, scfg meta.ServerConfig, want int) (*mirrorServer, time.Duration, error) {
	dev, err := c.device(fmt.Sprintf("meta-%d", c.nextID.Add(1)))
	if err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	srv, err := meta.NewServer(dev, scfg)
	if err != nil {
		dev.Close()
		return nil, 0, err
	}
	m := &mirrorServer{Server: srv, dev: dev}
	if err := waitRecords(ctx, srv, want); err != nil {
		m.close()
		return nil, 0, err
	}
	return m, time.Since(t0), nil
}

// mirrorBound bounds the wait for a MetaServer to hold the records etcd
// holds.
const mirrorBound = 2 * time.Minute

// waitRecords waits until srv's table holds at least want records.
func waitRecords(ctx context.Context, srv *meta.Server, want int) error {
	ctx, cancel := context.WithTimeout(ctx, mirrorBound)
	defer cancel()
	for srv.Stats().Records < want {
		if err := sleep(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("MetaServer holds %d of %d records (%+v): %w", srv.Stats().Records, want, srv.Stats(), err)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// startTimed starts k full runtimes, par at a time (k at once when par is
// k), and returns those that started, how long each start took (failed
// ones too) and why each failed one failed.
func (c *cluster) startTimed(ctx context.Context, k, par int, metas []meta.Info) ([]*node, []time.Duration, []error) {
	nodes := make([]*node, k)
	took := make([]time.Duration, k)
	errs := make([]error, k)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t := time.Now()
			nodes[i], errs[i] = c.startNode(ctx, metas)
			took[i] = time.Since(t)
		})
	}
	wg.Wait()
	var out []*node
	var failed []error
	for i, n := range nodes {
		if n != nil {
			out = append(out, n)
		} else {
			failed = append(failed, errs[i])
		}
	}
	c.mu.Lock()
	c.live += len(out)
	c.mu.Unlock()
	return out, took, failed
}

// maxConnectors is how many nodes connect at once. In RC-only mode every
// connect is a handshake with the peer's runtime over UD, and 128 nodes'
// 12,800 handshakes at once on 2 shared cores outlast the control calls'
// retries. In DC mode a connect is one MetaServer READ of microseconds:
// with 128 nodes at once its time was mostly the wait for a core behind
// the other 127, and the p99 swung 0.04-0.9x between runs with the load.
const maxConnectors = 8

// connectors is how many of k nodes connect at once.
func (c *cluster) connectors(k int) int { return min(k, maxConnectors) }

// retire closes full runtimes, which withdraws their records.
func (c *cluster) retire(nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(n.close)
	}
	wg.Wait()
	c.mu.Lock()
	c.live -= len(nodes)
	c.mu.Unlock()
}

// targets is who the sample connects to: any registered node in DC mode
// (the host, the sample, the stand-ins), the sample itself in RC-only
// mode.
func (c *cluster) targets(sample []*node) []krcore.NodeID {
	if c.mode == ModeRC {
		ids := make([]krcore.NodeID, len(sample))
		for i, n := range sample {
			ids[i] = n.rt.Node()
		}
		return ids
	}
	ids := []krcore.NodeID{c.host.rt.Node()}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range sample {
		ids = append(ids, n.rt.Node())
	}
	return append(ids, c.standins...)
}

// connectAll has every node connect one queue to peers random targets
// other than itself, par nodes at a time, and returns every connect's time
// and how many needed a retry.
func connectAll(ctx context.Context, nodes []*node, targets []krcore.NodeID, peers, par int) ([]time.Duration, int, error) {
	lat := make([][]time.Duration, len(nodes))
	retried := make([]int, len(nodes))
	errs := make([]error, len(nodes))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			lat[i], retried[i], errs[i] = n.connect(ctx, pick(targets, n.rt.Node(), peers))
		})
	}
	wg.Wait()
	total := 0
	for _, r := range retried {
		total += r
	}
	return slices.Concat(lat...), total, errors.Join(errs...)
}

// pick chooses up to k distinct targets other than self.
func pick(targets []krcore.NodeID, self krcore.NodeID, k int) []krcore.NodeID {
	out := make([]krcore.NodeID, 0, k)
	for _, i := range rand.Perm(len(targets)) {
		if len(out) == k {
			break
		}
		if targets[i] != self {
			out = append(out, targets[i])
		}
	}
	return out
}

// connectTries is how often a connect is tried before the run fails: a
// MetaServer READ times out after 500 ms (meta.ClientConfig.ReadTimeout,
// the runtime's default) and an RC handshake's control call after its
// udrpc attempts, which a starved process on 2 shared cores can exceed;
// the application retries, and the time counted is all of it.
const connectTries = 4

// retryPause is the wait before a retry, times the tries so far: a peer
// whose handshake went unanswered is held dead by the runtime until its
// next probe answers.
const retryPause = 500 * time.Millisecond

// connect points one queue at each of to in turn and times each Connect,
// retries included; it returns the times and how many connects needed a
// retry.
func (n *node) connect(ctx context.Context, to []krcore.NodeID) ([]time.Duration, int, error) {
	q, err := n.rt.Queue()
	if err != nil {
		return nil, 0, err
	}
	defer q.Close()
	lat := make([]time.Duration, 0, len(to))
	retried := 0
	for _, peer := range to {
		t := time.Now()
		for try := 1; ; try++ {
			err := q.Connect(ctx, peer, nil)
			if err == nil {
				break
			}
			if try == connectTries || ctx.Err() != nil {
				return lat, retried, fmt.Errorf("node %d connect to %d, try %d: %w", n.rt.Node(), peer, try, err)
			}
			if err := sleep(ctx, time.Duration(try)*retryPause); err != nil {
				return lat, retried, err
			}
			if try == 1 {
				retried++
			}
		}
		lat = append(lat, time.Since(t))
	}
	return lat, retried, nil
}

// qpSpread is the QPs on the nodes' RNICs: every QP the runtime and its
// MetaServer client made.
func qpSpread(nodes []*node) Spread {
	var s Spread
	for _, n := range nodes {
		q := float64(n.dev.Stats().QPs)
		s.Mean += q / float64(len(nodes))
		s.Max = max(s.Max, q)
	}
	return s
}

// heapInUse is the process's Go heap in use after a GC: what the sample
// adds to it, divided among the sample, is a node's memory (the soft
// RNIC's QPs and queues live there; the receive buffers the runtime maps
// off the heap are 64 slots of 1 KiB here, not counted). The process's
// resident set is not used: freed pages stay resident and are reused.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// reads times k lookups of random registered nodes, each one READ of the
// MetaServer (Fetch goes past the cache).
func (c *cluster) reads(ctx context.Context, info meta.Info, k int) (Percentiles, error) {
	obs, err := c.observer(info)
	if err != nil {
		return Percentiles{}, err
	}
	defer obs.close()
	top := c.nextID.Load()
	lat := make([]time.Duration, 0, k)
	for range k {
		id := 1 + rand.Uint64N(top)
		t := time.Now()
		_, err := obs.cli.Fetch(ctx, id)
		if err != nil && !errors.Is(err, meta.ErrNotFound) { // ids of devices without records
			return Percentiles{}, fmt.Errorf("fetch %d: %w", id, err)
		}
		lat = append(lat, time.Since(t))
	}
	return percentiles(lat), nil
}

// storm has Join nodes join at once, JoinFull of them full runtimes, and
// the sample connect to some of them.
func (c *cluster) storm(ctx context.Context, st *Stage, srv *meta.Server, metas []meta.Info, sample []*node) error {
	before := c.live
	st.Joined = c.cfg.Join
	t0 := time.Now()
	var joiners []*node
	var took []time.Duration
	var failed []error
	var standins []krcore.NodeID
	var errStand error
	var wg sync.WaitGroup
	wg.Go(func() { joiners, took, failed = c.startTimed(ctx, c.cfg.JoinFull, max(c.cfg.JoinFull, 1), metas) })
	wg.Go(func() {
		standins, errStand = c.registerStandins(ctx, c.cfg.Join-c.cfg.JoinFull, max(c.cfg.Join-c.cfg.JoinFull, 1))
	})
	wg.Wait()
	defer c.retire(joiners)
	// A runtime that gave up joining (its record not served within the
	// runtime's bound) is a finding of the run, not its failure.
	st.JoinFailed += len(failed)
	if len(failed) > 0 {
		fmt.Fprintf(c.cfg.Log, "%s N=%d: %d of %d full runtimes failed to join in the storm, first: %v\n",
			c.mode, st.N, len(failed), c.cfg.JoinFull, failed[0])
	}
	if errStand != nil || (len(joiners) == 0 && c.cfg.JoinFull > 0) {
		return errors.Join(append(failed, errStand)...)
	}
	if err := waitRecords(ctx, srv, before+len(joiners)+len(standins)); err != nil {
		return err
	}
	st.JoinAll, st.JoinFull = time.Since(t0), percentiles(took)
	var to []krcore.NodeID
	for _, n := range joiners {
		to = append(to, n.rt.Node())
	}
	if c.mode == ModeDC {
		to = append(to, standins...)
	}
	k := min(10, len(to))
	st.JoinConnectsTo = k
	lat, retried, err := connectAll(ctx, sample, to, k, c.connectors(len(sample)))
	st.Retried += retried
	st.JoinConnect = percentiles(lat)
	return err
}

// Line is the stage as one line of the run's log.
func (s Stage) Line() string {
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }
	return fmt.Sprintf("%-7s N=%-6d grow +%d in %v, rebuild %v; join p50/p99 %v/%v; table %d B (%dx%d, unplaced %d), READ %d B p50/p99 %s/%s us; "+
		"connect p50/p99 %s/%s us (%d, %d retried); QPs/node %.1f (max %.0f); heap/node %.0f KiB; "+
		"join of %d at once: full runtime p50/p99 %v/%v (%d failed), all in table %v; connect to joiners p50/p99 %s/%s us",
		s.Mode, s.N, s.Added, s.Grow.Round(time.Millisecond), s.Rebuild.Round(time.Millisecond),
		s.Join.P50.Round(time.Millisecond), s.Join.P99.Round(time.Millisecond),
		s.TableBytes, s.Buckets, s.Slots, s.Unplaced, s.ReadBytes, us(s.Read.P50), us(s.Read.P99),
		us(s.Connect.P50), us(s.Connect.P99), s.Connects, s.Retried, s.QPs.Mean, s.QPs.Max, s.HeapB/1024,
		s.Joined, s.JoinFull.P50.Round(time.Millisecond), s.JoinFull.P99.Round(time.Millisecond), s.JoinFailed, s.JoinAll.Round(time.Millisecond),
		us(s.JoinConnect.P50), us(s.JoinConnect.P99))
}
