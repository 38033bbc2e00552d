package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// -pin puts a process and the children it has started on the database's
// core, and this process's threads on the others; a child this process
// starts afterwards inherits the others.
func TestPinPlacesTheClusterApart(t *testing.T) {
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = setThreads(os.Getpid(), &before) }) // the rest of the package runs on every core again
	p, err := newPinning()
	if err != nil {
		t.Fatal(err) // the machine has 2 cores: a test machine with one cannot run the postgres cases either
	}
	// A stand-in for the postmaster: a shell and the child it waits for.
	pm := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := pm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pm.Process.Kill(); _ = pm.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for len(childrenOf(pm.Process.Pid)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	kids := childrenOf(pm.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("the stand-in's children: %v, want its sleep", kids)
	}
	if err := p.apply(pm.Process.Pid); err != nil {
		t.Fatal(err)
	}
	db := strconv.Itoa(p.dbCore)
	for _, pid := range []int{pm.Process.Pid, kids[0]} {
		if got := allowed(t, pid); got != db {
			t.Errorf("process %d may run on cores %q, want %q", pid, got, db)
		}
	}
	if got := allowed(t, os.Getpid()); strings.Contains(","+got+",", ","+db+",") {
		t.Errorf("the harness may still run on the database's core: %q", got)
	}
	later := exec.Command("sleep", "30")
	if err := later.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = later.Process.Kill(); _ = later.Wait() }()
	if got := allowed(t, later.Process.Pid); strings.Contains(","+got+",", ","+db+",") {
		t.Errorf("an instance started after -pin may run on the database's core: %q", got)
	}
}

// allowed is a process's Cpus_allowed_list.
func allowed(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list for %d", pid)
	return ""
}
