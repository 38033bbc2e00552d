package main

// PostgreSQL's CPU per accepted read beside its floor (issue 42): after
// the rounds the harness writes pgtest.FloorReads, the rows an accepted
// read needs for the guarantees across instances set-based over groups of
// distinct users, in a database of its own on the same cluster, and counts
// the cluster's CPU over it as the cases' pg cpu is counted (every process
// of the cluster, background included). Each accepted case's CPU per read
// is then read against it.

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
)

// floorGroup is the floor's reads per group transaction: about the money
// path's own under load (4.5 reads a group in issue 28's runs).
const floorGroup = 5

// floorReads is how many reads the floor writes: seconds of PostgreSQL's
// work, against which its background (WAL writer, checkpointer) is small.
const floorReads = 20_000

// maxFloorRatio is issue 42's bound on an accepted case's PostgreSQL CPU
// per read over the floor's.
const maxFloorRatio = 1.5

// floorCPU writes the floor's reads and returns the cluster's CPU per read
// over them; zero, with no error, on a server the harness did not start
// (its CPU is not counted).
func (b *bench) floorCPU() (time.Duration, error) {
	if b.pg == nil || b.pg.cluster == nil {
		return 0, nil
	}
	b.progress("the floor: %s reads in groups of %d, set-based, one session", thousands(floorReads), floorGroup)
	db, err := b.pg.newDatabase("floor", "the floor")
	if err != nil {
		return 0, err
	}
	bw, err := newBreakwater("floor", b.bin, filepath.Join(b.dir, "floor"), bwConfig{postgresURL: db.url})
	if err != nil {
		return 0, err
	}
	if _, err := bw.createKeyStopped("floor"); err != nil { // the schema, made as an instance makes it
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.url)
	if err != nil {
		return 0, fmt.Errorf("the floor: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, pgtest.FloorSetup); err != nil {
		return 0, fmt.Errorf("the floor: setup: %w", err)
	}
	before := b.pg.cpu()
	if _, err := conn.Exec(ctx, pgtest.FloorReads(floorReads/floorGroup, floorGroup)); err != nil {
		return 0, fmt.Errorf("the floor: %w", err)
	}
	return (b.pg.cpu() - before) / floorReads, nil
}

// pgCPUPerRead is a case's median PostgreSQL CPU per accepted read over
// the rounds (the cluster's cores over the measured time, over the rate).
func (r *report) pgCPUPerRead(id string) time.Duration {
	var vs []time.Duration
	for _, s := range r.samples[id] {
		if s.rps > 0 {
			vs = append(vs, time.Duration(s.pgCPU/s.rps*float64(time.Second)))
		}
	}
	return median(vs)
}

// printFloor writes each accepted postgres case's CPU per read beside the
// floor's, with issue 42's target.
func (r *report) printFloor(w io.Writer) {
	if r.floor <= 0 {
		return
	}
	fmt.Fprintf(w, "\nPostgreSQL CPU per accepted read (the cluster's processes over the measured time, over the reads), against its floor:\n")
	fmt.Fprintf(w, " %s a read, %s reads in groups of %d distinct users, every statement set-based, in one session (pgtest.FloorReads)\n",
		roundDuration(r.floor), thousands(floorReads), floorGroup)
	lw := r.labelWidth()
	fmt.Fprintf(w, "%-*s %10s %8s %8s  %s\n", lw, "case", "cpu/read", "÷ floor", "target", "")
	for _, c := range r.cases {
		if c.pg == nil || c.refusals {
			continue
		}
		per := r.pgCPUPerRead(c.id)
		ratio := float64(per) / float64(r.floor)
		fmt.Fprintf(w, "%-*s %10s %8.2f %8s  %s\n", lw, c.label, roundDuration(per), ratio,
			fmt.Sprintf("≤ %.1f", maxFloorRatio), metLabel(ratio <= maxFloorRatio))
	}
}
