package pgtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcCPU reads /proc/PID/stat: pid's parent, its own CPU time (user and
// system) and that of the children it has reaped; ok is false when pid is
// gone or not on this machine. Benchmarks use it to tell PostgreSQL's
// share of the CPU (its postmaster and the backends of a database).
func ProcCPU(pid int) (ppid int, own, reaped time.Duration, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	// The fields after the command's closing parenthesis: the state is
	// field 0, the parent 1, utime 11, stime 12, cutime 13, cstime 14.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, ticks(f[11]) + ticks(f[12]), ticks(f[13]) + ticks(f[14]), true
}

// ticks is a /proc time field, counted in USER_HZ (100 a second).
func ticks(field string) time.Duration {
	n, _ := strconv.ParseInt(field, 10, 64)
	return time.Duration(n) * time.Second / 100
}
