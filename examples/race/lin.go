package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/internal/racekv"
)

// linConfig is a linearizability run: Clients processes of Mode each make
// Ops random gets and puts on Keys keys; one kills itself between a put's
// block WRITE and its slot CAS, and one is killed by the coordinator at a
// random operation (Kills of them, 0 to 2).
type linConfig struct {
	Mode               string
	Clients, Ops, Keys int
	Kills              int
	Timeout            time.Duration // porcupine's bound
}

// linInput and linOutput are an operation of porcupine's key-value model.
type linInput struct {
	Key   string
	Put   bool
	Value string
}

type linOutput struct {
	Value string
	Found bool
}

// initialValue is what every key of a linearizability run starts with.
const initialValue = "v0"

// kvModel is a linearizable register per key, partitioned by key.
var kvModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(linInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return initialValue },
	Step: func(state, in, out any) (bool, any) {
		i := in.(linInput)
		if i.Put {
			return true, i.Value
		}
		o := out.(linOutput)
		return o.Found && o.Value == state.(string), state
	},
	DescribeOperation: func(in, out any) string {
		i := in.(linInput)
		if i.Put {
			return fmt.Sprintf("put(%s, %s)", i.Key, i.Value)
		}
		o, _ := out.(linOutput)
		return fmt.Sprintf("get(%s) -> %s %v", i.Key, o.Value, o.Found)
	},
}

// linReport is what a linearizability run found.
type linReport struct {
	Ops, PendingPuts, Killed, KilledMidPut int
	Result                                 porcupine.CheckResult
}

// linRuns numbers the runs, so each has keys of its own.
var linRuns int

// runLin runs cfg against s and checks the recorded history with
// porcupine; dir, if set, receives a visualisation when it is not
// linearizable.
func runLin(ctx context.Context, s *site, cfg linConfig, dir string, out io.Writer) (linReport, error) {
	linRuns++
	run := linRuns
	var rep linReport
	own, err := s.ownClient(ctx)
	if err != nil {
		return rep, err
	}
	defer own.close()
	for k := range cfg.Keys {
		if err := own.Put(ctx, linKey(run, k), []byte(initialValue)); err != nil {
			return rep, err
		}
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.wait(ctx)
		}
	}()
	for i := range cfg.Clients {
		job := s.job(cfg.Mode, 1)
		job.Keys = 0 // the first lookup reads a lin key instead
		job.LinRun, job.LinKeys, job.Ops = run, cfg.Keys, cfg.Ops
		if i == 0 && cfg.Kills >= 1 {
			job.DieAt = 1 + rand.IntN(max(cfg.Ops/4, 1))
		}
		killAt := 0
		if i == 1 && cfg.Kills >= 2 {
			killAt = cfg.Ops/4 + 1 + rand.IntN(max(cfg.Ops/2, 1))
		}
		p, err := spawn(ctx, job, killAt)
		if err != nil {
			return rep, err
		}
		procs = append(procs, p)
	}
	var hist []porcupine.Operation
	for _, p := range procs {
		lines, err := p.wait(ctx)
		if err != nil {
			if p.job.DieAt == 0 && p.killAt == 0 {
				return rep, err
			}
			rep.Killed++
		}
		h, midPut, err := history(lines)
		if err != nil {
			return rep, fmt.Errorf("client %d: %w", p.job.ID, err)
		}
		hist = append(hist, h...)
		if midPut {
			rep.KilledMidPut++
		}
	}
	procs = nil
	for k := range cfg.Keys { // the table after the kills: read by the coordinator
		key := linKey(run, k)
		call := time.Now().UnixNano()
		v, found, err := own.Get(ctx, key)
		if err != nil {
			return rep, err
		}
		hist = append(hist, porcupine.Operation{ClientId: 0, Input: linInput{Key: string(key)}, Call: call,
			Output: linOutput{Value: string(v), Found: found}, Return: time.Now().UnixNano()})
	}
	for i := range hist {
		if hist[i].Return == math.MaxInt64 {
			// Pending: it may take effect any time after its call, or
			// never, which is the same as after everything else.
			hist[i].Return = time.Now().UnixNano()
			rep.PendingPuts++
		}
	}
	rep.Ops = len(hist)
	res, info := porcupine.CheckOperationsVerbose(kvModel, hist, cfg.Timeout)
	rep.Result = res
	fmt.Fprintf(out, "linearizability (%s): %d clients x %d ops on %d keys, %d killed (%d in the middle of a put), %d puts pending; %d operations checked with porcupine: %s\n",
		cfg.Mode, cfg.Clients, cfg.Ops, cfg.Keys, rep.Killed, rep.KilledMidPut, rep.PendingPuts, rep.Ops, res)
	if res != porcupine.Ok && dir != "" {
		path := filepath.Join(dir, fmt.Sprintf("race-lin-%s.html", cfg.Mode))
		if err := porcupine.VisualizePath(kvModel, info, path); err == nil {
			fmt.Fprintf(out, "  the history: %s\n", path)
		}
	}
	return rep, nil
}

// history turns a client's call and ret lines into operations: a call
// without its ret is dropped if a get and pending (Return MaxInt64) if a
// put; midPut reports that the last one was a pending put.
func history(lines []string) (ops []porcupine.Operation, midPut bool, err error) {
	rets := map[int]ret{}
	for _, l := range linesOf(lines, "ret") {
		var r ret
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			return nil, false, err
		}
		rets[r.Seq] = r
	}
	for _, l := range linesOf(lines, "call") {
		var c call
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			return nil, false, err
		}
		op := porcupine.Operation{ClientId: int(c.Client), Input: linInput{Key: c.Key, Put: c.Put, Value: c.Value}, Call: c.T}
		r, done := rets[c.Seq]
		midPut = !done && c.Put
		switch {
		case done:
			op.Output, op.Return = linOutput{Value: r.Value, Found: r.Found}, r.T
		case c.Put:
			op.Return = math.MaxInt64
		default:
			continue
		}
		ops = append(ops, op)
	}
	return ops, midPut, nil
}

// ownClient is a table client of the coordinator itself, attached to the
// host's krcored.
func (s *site) ownClient(ctx context.Context) (*attached, error) {
	api, err := client.Attach(ctx, client.Options{Socket: s.socket})
	if err != nil {
		return nil, err
	}
	a := &attached{api: api}
	var mems []racekv.Memory
	for i := range s.mem {
		m, err := racekv.DialVQ(ctx, api, uint64(i+1), racekv.Name)
		if err != nil {
			for _, m := range mems {
				m.Close()
			}
			api.Close()
			return nil, err
		}
		mems = append(mems, m)
	}
	if a.Client, err = racekv.Open(ctx, mems); err != nil {
		a.close()
	}
	return a, err
}

// attached is a table client through krcored.
type attached struct {
	*racekv.Client
	api *client.Client
}

// close closes the table client and detaches.
func (a *attached) close() {
	if a.Client != nil {
		a.Client.Close()
	}
	a.api.Close()
}
