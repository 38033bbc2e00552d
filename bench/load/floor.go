package main

// PostgreSQL's CPU per accepted read beside its floor (issue 42): after
// the rounds the harness writes pgtest.FloorReads, the rows an accepted
// read needs for the guarantees across instances set-based over groups of
// distinct users, in a database of its own on the same cluster, and counts
// the cluster's CPU over it as the cases' pg cpu is counted (every process
// of the cluster, background included). Each accepted case's CPU per read
// is then read against it, and against the same rows sent from a client a
// statement each (pgtest.FloorFromClient): what the protocol and the
// per-row statements add before any of Breakwater's logic.

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

// floorFigure is PostgreSQL's CPU per read at the floor, and with the
// same rows sent from a client a statement a row.
type floorFigure struct {
	set, client time.Duration
}

// floorCPU writes the floor's reads, set-based in one DO block and then
// from a client (pgtest.FloorFromClient), and returns the cluster's CPU
// per read over each; zero, with no error, on a server the harness did
// not start (its CPU is not counted).
func (b *bench) floorCPU() (floorFigure, error) {
	if b.pg == nil || b.pg.cluster == nil {
		return floorFigure{}, nil
	}
	b.progress("the floor: %s reads in groups of %d, set-based, one session; then from a client", thousands(floorReads), floorGroup)
	var f floorFigure
	var err error
	if f.set, err = b.floorRun("floor", false); err != nil {
		return f, err
	}
	f.client, err = b.floorRun("floor_client", true)
	return f, err
}

// floorRun writes the floor's reads into a database of its own, name,
// set-based or from a client, and returns the cluster's CPU per read.
func (b *bench) floorRun(name string, client bool) (time.Duration, error) {
	db, err := b.pg.newDatabase(name, "the floor")
	if err != nil {
		return 0, err
	}
	bw, err := newBreakwater(name, b.bin, filepath.Join(b.dir, name), bwConfig{postgresURL: db.url})
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
	if client {
		err = pgtest.FloorFromClient(ctx, conn, floorReads/floorGroup, floorGroup)
	} else {
		_, err = conn.Exec(ctx, pgtest.FloorReads(floorReads/floorGroup, floorGroup))
	}
	if err != nil {
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
// floor's, with issue 42's target, and beside the client floor's (the
// same rows a statement each from a client: what the protocol adds).
func (r *report) printFloor(w io.Writer) {
	if r.floor.set <= 0 {
		return
	}
	fmt.Fprintf(w, "\nPostgreSQL CPU per accepted read (the cluster's processes over the measured time, over the reads), against its floor:\n")
	fmt.Fprintf(w, " %s a read, %s reads in groups of %d distinct users, every statement set-based, in one session (pgtest.FloorReads);\n",
		roundDuration(r.floor.set), thousands(floorReads), floorGroup)
	fmt.Fprintf(w, " from a client, the same rows a statement each, pipelined, one session (pgtest.FloorFromClient): %s a read, %.2f × the floor\n",
		roundDuration(r.floor.client), float64(r.floor.client)/float64(r.floor.set))
	lw := r.labelWidth()
	fmt.Fprintf(w, "%-*s %10s %8s %8s %9s  %s\n", lw, "case", "cpu/read", "÷ floor", "target", "÷ client", "")
	for _, c := range r.cases {
		if c.pg == nil || c.refusals {
			continue
		}
		per := r.pgCPUPerRead(c.id)
		ratio := float64(per) / float64(r.floor.set)
		client := "–"
		if r.floor.client > 0 {
			client = fmt.Sprintf("%.2f", float64(per)/float64(r.floor.client))
		}
		fmt.Fprintf(w, "%-*s %10s %8.2f %8s %9s  %s\n", lw, c.label, roundDuration(per), ratio,
			fmt.Sprintf("≤ %.1f", maxFloorRatio), client, metLabel(ratio <= maxFloorRatio))
	}
}
