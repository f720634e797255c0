package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/racekv"
	"github.com/krcore/krcore/meta"
)

// clientEnv holds a client process's job (clientJob as JSON): its
// presence makes the process a client.
const clientEnv = "RACEKV_CLIENT"

// The ways a client reaches the memory nodes.
const (
	modeRaw      = "raw"      // its own RNIC context, an RC QP per memory node, endpoints over TCP
	modeEmbedded = "embedded" // its own RNIC context and krcore runtime, a VQ per memory node
	modeDaemon   = "daemon"   // attached to the host's krcored, a VQ per memory node
)

// clientJob is what a client process is told to do.
type clientJob struct {
	Mode     string   `json:"mode"`
	Meta     string   `json:"meta,omitempty"`   // the MetaServer (embedded)
	MemNodes []uint64 `json:"mem_nodes"`        // memory node ids (embedded, daemon)
	RCAddrs  []string `json:"rc_addrs"`         // memory nodes' RC listeners (raw)
	Socket   string   `json:"socket,omitempty"` // krcored's (daemon)
	ID       uint64   `json:"id"`               // the client's number, and its node id (embedded)
	Keys     int      `json:"keys"`             // the loaded keys are keyOf(0..Keys-1)
	// Fabric is the RNIC a raw or embedded client opens for itself and
	// its QPs' attributes.
	Fabric fabric `json:"fabric"`

	// The workload: YCSB Workload over the keys with values of Value
	// bytes, from the first lookup until Until, counting completed
	// operations in buckets of Bucket from Epoch (Unix ns); lookups are
	// timed apart before and after Spike.
	Workload string `json:"workload,omitempty"`
	Value    int    `json:"value,omitempty"`
	Epoch    int64  `json:"epoch,omitempty"`
	Bucket   int64  `json:"bucket,omitempty"`
	Spike    int64  `json:"spike,omitempty"`
	Until    int64  `json:"until,omitempty"`

	// The linearizability run instead: Ops random gets and puts of the
	// keys linKey(LinRun, 0..LinKeys-1), each logged before and after; with DieAt
	// the process kills itself (SIGKILL) in its DieAt-th put between the
	// block WRITE and the slot CAS.
	LinRun  int `json:"lin_run,omitempty"`
	LinKeys int `json:"lin_keys,omitempty"`
	Ops     int `json:"ops,omitempty"`
	DieAt   int `json:"die_at,omitempty"`
}

// boot is when a client process reached each step, in Unix ns.
type boot struct {
	Main      int64 `json:"main"`      // main started
	Ready     int64 `json:"ready"`     // RNIC and runtime up, or attached to krcored
	Connected int64 `json:"connected"` // a connection to each memory node, the table's header read
	First     int64 `json:"first"`     // the first lookup completed
}

// result is a workload client's account.
type result struct {
	Ops     []int   `json:"ops"`     // completed operations per bucket since Epoch
	Before  []int64 `json:"before"`  // lookup latencies (ns) of lookups started before Spike
	After   []int64 `json:"after"`   // and after
	Updates int     `json:"updates"` // puts completed
}

// clientTimeout bounds a client process's whole life.
const clientTimeout = 5 * time.Minute

// runClient is a client process's main, if this process is one: it runs
// the job in clientEnv and exits.
func runClient(started time.Time) {
	runRole(clientEnv, func(job *clientJob) error {
		if err := job.run(started); err != nil {
			return fmt.Errorf("client %d: %w", job.ID, err)
		}
		return nil
	})
}

// runRole is this process's main if env holds its job (selfCommand): it
// decodes the job, runs it and exits with the outcome. Otherwise it
// returns.
func runRole[J any](env string, run func(*J) error) {
	text, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	var job J
	err := json.Unmarshal([]byte(text), &job)
	if err == nil {
		err = run(&job)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "race:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// emit writes one report line: kind, then v as JSON (one write).
func emit(kind string, v any) {
	b, _ := json.Marshal(v)
	os.Stdout.Write(append(append([]byte(kind+" "), b...), '\n'))
}

// run connects, makes the first lookup, reports, then works.
func (job *clientJob) run(started time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	b := boot{Main: started.UnixNano()}
	rng := rand.New(rand.NewPCG(job.ID, uint64(started.UnixNano())))
	mems, release, err := job.dial(ctx, &b)
	if err != nil {
		return err
	}
	defer release()
	c, err := racekv.Open(ctx, mems)
	if err != nil {
		return err
	}
	defer c.Close()
	b.Connected = time.Now().UnixNano()
	first := linKey(job.LinRun, 0)
	if job.Keys > 0 {
		first = keyOf(rng.Uint64N(uint64(job.Keys)))
	}
	if _, ok, err := c.Get(ctx, first); err != nil || !ok {
		return fmt.Errorf("first lookup: found %v: %w", ok, err)
	}
	b.First = time.Now().UnixNano()
	emit("boot", b)
	if job.Ops > 0 {
		return job.linearizable(ctx, c, rng)
	}
	return job.workload(ctx, c, rng)
}

// dial reaches every memory node the job's way, and returns what to
// release once the client is closed.
func (job *clientJob) dial(ctx context.Context, b *boot) ([]racekv.Memory, func(), error) {
	var mems []racekv.Memory
	closeAll := func() {
		for _, m := range mems {
			m.Close()
		}
	}
	switch job.Mode {
	case modeRaw:
		dev, err := job.Fabric.open(ctx)
		if err != nil {
			return nil, nil, err
		}
		b.Ready = time.Now().UnixNano()
		for _, addr := range job.RCAddrs {
			m, err := racekv.DialRC(ctx, dev, addr, job.Fabric.path())
			if err != nil {
				closeAll()
				dev.Close()
				return nil, nil, err
			}
			mems = append(mems, m)
		}
		return mems, func() { dev.Close() }, nil
	case modeEmbedded, modeDaemon:
		api, release, err := job.runtime(ctx)
		if err != nil {
			return nil, nil, err
		}
		b.Ready = time.Now().UnixNano()
		for _, node := range job.MemNodes {
			m, err := racekv.DialVQ(ctx, api, node, racekv.Name)
			if err != nil {
				closeAll()
				release()
				return nil, nil, err
			}
			mems = append(mems, m)
		}
		return mems, release, nil
	}
	return nil, nil, fmt.Errorf("mode %q", job.Mode)
}

// runtime is the krcore runtime the job uses: its own (embedded) or
// krcored's.
func (job *clientJob) runtime(ctx context.Context) (krcore.API, func(), error) {
	if job.Mode == modeDaemon {
		cl, err := client.Attach(ctx, client.Options{Socket: job.Socket})
		if err != nil {
			return nil, nil, err
		}
		return cl, func() { cl.Close() }, nil
	}
	info, err := meta.ParseInfo(job.Meta)
	if err != nil {
		return nil, nil, err
	}
	node, err := job.Fabric.startNode(ctx, krcore.NodeID(job.ID), []meta.Info{info})
	if err != nil {
		return nil, nil, err
	}
	return core.Embed(node.Runtime), func() { node.Close() }, nil
}

// workload runs the job's YCSB workload until its end.
func (job *clientJob) workload(ctx context.Context, c *racekv.Client, rng *rand.Rand) error {
	z := newZipf(uint64(job.Keys), rng)
	reads := workloads[job.Workload]
	res := result{Ops: make([]int, (job.Until-job.Epoch+job.Bucket-1)/job.Bucket)}
	val := make([]byte, job.Value)
	for seq := 0; ; seq++ {
		start := time.Now()
		if start.UnixNano() >= job.Until {
			break
		}
		key := keyOf(z.next())
		if rng.Float64() < reads {
			if _, ok, err := c.Get(ctx, key); err != nil || !ok {
				return fmt.Errorf("get %s: found %v: %w", key, ok, err)
			}
			lat := int64(time.Since(start))
			if start.UnixNano() < job.Spike {
				res.Before = append(res.Before, lat)
			} else {
				res.After = append(res.After, lat)
			}
		} else {
			copy(val, fmt.Appendf(nil, "client %d op %d ", job.ID, seq))
			if err := c.Put(ctx, key, val); err != nil {
				return fmt.Errorf("put %s: %w", key, err)
			}
			res.Updates++
		}
		if b := (time.Now().UnixNano() - job.Epoch) / job.Bucket; b >= 0 && b < int64(len(res.Ops)) {
			res.Ops[b]++
		}
	}
	emit("result", res)
	return nil
}

// linKey is key i of linearizability run run.
func linKey(run, i int) []byte { return fmt.Appendf(nil, "lin%d-%d", run, i) }

// call and ret are one logged operation's invocation and response.
type call struct {
	Client uint64 `json:"c"`
	Seq    int    `json:"s"`
	Key    string `json:"k"`
	Put    bool   `json:"put"`
	Value  string `json:"v,omitempty"`
	T      int64  `json:"t"`
}

type ret struct {
	Client uint64 `json:"c"`
	Seq    int    `json:"s"`
	Value  string `json:"v,omitempty"`
	Found  bool   `json:"found"`
	T      int64  `json:"t"`
}

// linearizable runs the job's random gets and puts, logging each.
func (job *clientJob) linearizable(ctx context.Context, c *racekv.Client, rng *rand.Rand) error {
	puts := 0
	c.BeforeCAS = func() {
		if puts++; puts == job.DieAt {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			os.Exit(137) // not reached: SIGKILL to oneself is delivered at once
		}
	}
	for seq := range job.Ops {
		key, put := linKey(job.LinRun, rng.IntN(job.LinKeys)), rng.IntN(2) == 0
		in := call{Client: job.ID, Seq: seq, Key: string(key), Put: put, T: time.Now().UnixNano()}
		if put {
			in.Value = fmt.Sprintf("c%d-%d", job.ID, seq)
		}
		emit("call", in)
		out := ret{Client: job.ID, Seq: seq}
		var err error
		if put {
			err = c.Put(ctx, key, []byte(in.Value))
		} else {
			var v []byte
			v, out.Found, err = c.Get(ctx, key)
			out.Value = string(v)
		}
		if err != nil {
			return fmt.Errorf("operation %d: %w", seq, err)
		}
		out.T = time.Now().UnixNano()
		emit("ret", out)
	}
	return nil
}
