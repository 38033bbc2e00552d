package main

// -pin (with -postgres): the throwaway cluster on a core of its own, the
// instances, the load generator and this harness on the others, as
// `taskset` would place them. It is the closest this machine comes to a
// database on its own host: the instances' work and PostgreSQL's no
// longer take each other's time.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"breakwater/storage/postgres/pgtest"
)

// pinning is where -pin puts PostgreSQL (db) and everything else (rest).
type pinning struct {
	db, rest unix.CPUSet
	dbCore   int
}

// newPinning gives PostgreSQL the last of the cores this process may run
// on and the rest to everything else; it needs two at least.
func newPinning() (pinning, error) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		return pinning{}, fmt.Errorf("-pin: read this process's cores: %w", err)
	}
	var cores []int
	for c := range 1024 {
		if mine.IsSet(c) {
			cores = append(cores, c)
		}
	}
	if len(cores) < 2 {
		return pinning{}, fmt.Errorf("-pin needs two cores at least; this process may run on %d", len(cores))
	}
	p := pinning{dbCore: cores[len(cores)-1]}
	p.db.Set(p.dbCore)
	for _, c := range cores[:len(cores)-1] {
		p.rest.Set(c)
	}
	return p, nil
}

// String says where each part runs, for the report.
func (p pinning) String() string {
	return fmt.Sprintf("PostgreSQL pinned to core %d, the instances, the load generator and the harness to the %d other(s)", p.dbCore, p.rest.Count())
}

// apply pins the cluster whose postmaster is pm (it and every process it
// has started, each thread; backends started later inherit it from the
// postmaster) and this process (each thread; the instances it starts
// later inherit it).
func (p pinning) apply(pm int) error {
	pids := append([]int{pm}, childrenOf(pm)...)
	for _, pid := range pids {
		if err := setThreads(pid, &p.db); err != nil {
			return fmt.Errorf("-pin: PostgreSQL process %d: %w", pid, err)
		}
	}
	// Every thread of this process, so that threads the runtime starts
	// later, and the children they start, inherit the rest.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := setThreads(os.Getpid(), &p.rest); err != nil {
		return fmt.Errorf("-pin: this harness: %w", err)
	}
	return nil
}

// setThreads sets the affinity of each thread of pid to set.
func setThreads(pid int, set *unix.CPUSet) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) { // a thread that ended meanwhile
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if ppid, _, _, ok := pgtest.ProcCPU(child); ok && ppid == pid {
			kids = append(kids, child)
		}
	}
	return kids
}
