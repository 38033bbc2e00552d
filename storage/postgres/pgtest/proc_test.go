package pgtest_test

import (
	"os"
	"syscall"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
)

// ProcCPU reads this process's parent and its CPU time, which grows as it
// works; a pid that does not exist is not ok. The work is measured by the
// kernel's own account of this process (getrusage), not by the wall
// clock: on a busy machine 200 ms of spinning got 40 ms of CPU.
func TestProcCPUReadsAProcess(t *testing.T) {
	ppid, before, _, ok := pgtest.ProcCPU(os.Getpid())
	if !ok || ppid != os.Getppid() {
		t.Fatalf("ProcCPU(self) = parent %d, ok %v; want parent %d", ppid, ok, os.Getppid())
	}
	const work = 100 * time.Millisecond
	start := selfCPU(t)
	x := 0
	for deadline := time.Now().Add(30 * time.Second); selfCPU(t)-start < work; x++ {
		if time.Now().After(deadline) {
			t.Fatalf("%v of CPU not had in 30 s of spinning", work)
		}
	}
	// /proc counts in clock ticks (10 ms): two of them either way.
	if _, after, _, _ := pgtest.ProcCPU(os.Getpid()); after-before < work-20*time.Millisecond {
		t.Fatalf("CPU time grew by %v in /proc while getrusage counted %v (%d turns)", after-before, selfCPU(t)-start, x)
	}
	if _, _, _, ok := pgtest.ProcCPU(1 << 30); ok {
		t.Fatal("ProcCPU of a pid that cannot exist is ok")
	}
}

// selfCPU is this process's user and system time, from getrusage.
func selfCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
