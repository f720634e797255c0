package soft

import (
	"fmt"
	"os"
	"sync/atomic"
)

var dbg struct {
	taken, asked, parks, blindAct, timerTakes, yields, lendWanters, interrupts, pollTakes, activates atomic.Int64
}

func dbgDump(addr string) {
	if os.Getenv("SOFTDBG") == "" {
		return
	}
	fmt.Fprintf(os.Stderr, "softdbg %s: taken %d asked %d parks %d blindAct %d timerTakes %d yields %d lendWanters %d interrupts %d pollTakes %d activates %d\n", addr,
		dbg.taken.Load(), dbg.asked.Load(), dbg.parks.Load(), dbg.blindAct.Load(), dbg.timerTakes.Load(), dbg.yields.Load(), dbg.lendWanters.Load(), dbg.interrupts.Load(), dbg.pollTakes.Load(), dbg.activates.Load())
}
