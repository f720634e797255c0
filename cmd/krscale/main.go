// Command krscale is krcore's scale run (issue 18 §4): a cluster of 1,000
// to 10,000 nodes joined through an embedded etcd and a MetaServer
// mirroring it, in one process, in DC mode and in RC-only mode; every
// measured node connects to 100 random others, then 1,000 nodes join at
// once. It prints a table per mode, the targets, and a PNG per
// figure. What runs for real and what stands in: go doc
// ./internal/scale.
//
//	krscale [-sizes 1000,2000,5000,10000] [-modes dc,rc-only] [-peers 100] [-sample 128]
//	        [-join 1000] [-join-full 64] [-reads 2000] [-workers 32] [-plots DIR]
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/krcore/krcore/internal/scale"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := scale.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
