package pgtest_test

import (
	"os"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
)

// ProcCPU reads this process's parent and its CPU time, which grows as it
// works; a pid that does not exist is not ok.
func TestProcCPUReadsAProcess(t *testing.T) {
	ppid, before, _, ok := pgtest.ProcCPU(os.Getpid())
	if !ok || ppid != os.Getppid() {
		t.Fatalf("ProcCPU(self) = parent %d, ok %v; want parent %d", ppid, ok, os.Getppid())
	}
	x := 0
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
		x++
	}
	if _, after, _, _ := pgtest.ProcCPU(os.Getpid()); after-before < 50*time.Millisecond {
		t.Fatalf("CPU time grew by %v over 200ms of spinning (%d turns)", after-before, x)
	}
	if _, _, _, ok := pgtest.ProcCPU(1 << 30); ok {
		t.Fatal("ProcCPU of a pid that cannot exist is ok")
	}
}
