//go:build failpoint

package failpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Enabled reports whether this build has failpoints compiled in.
const Enabled = true

// armed is the failpoint named in the environment, read once at start.
var armed = parse(os.Getenv(Env))

type point struct {
	name        string
	probability float64
}

// parse reads NAME[:PROBABILITY]. A malformed value ends the process at
// start: a crash test that silently never crashes would prove nothing.
func parse(v string) point {
	if v == "" {
		return point{}
	}
	name, prob, found := strings.Cut(v, ":")
	p := point{name: name, probability: 1}
	if found {
		f, err := strconv.ParseFloat(prob, 64)
		if err != nil || !(f > 0 && f <= 1) {
			fmt.Fprintf(os.Stderr, "%s=%q: the probability must be in (0, 1]\n", Env, v)
			os.Exit(2)
		}
		p.probability = f
	}
	return p
}

// Hit kills the process with SIGKILL when name is the armed failpoint and
// the draw fires.
func Hit(name string) {
	if armed.name != name || rand.Float64() >= armed.probability {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; run nothing more
}
