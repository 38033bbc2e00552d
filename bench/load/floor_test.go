package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestFloorCountsTheClusterCPU runs the floor on a throwaway cluster of
// its own (a server the harness did not start is not counted, as in
// .ci/run's): the cluster's CPU per read is counted, within what a read's
// rows can cost, the same rows from a client cost more, and the report
// sets each accepted postgres case's CPU per read against both, with the
// target, met or not.
func TestFloorCountsTheClusterCPU(t *testing.T) {
	t.Parallel() // a cluster of its own
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{dir: t.TempDir(), progress: t.Logf}
	defer b.close()
	if b.bin, err = buildBreakwater(root, b.dir); err != nil {
		t.Fatal(err)
	}
	if b.pg, err = startPostgres("", t.Logf); err != nil {
		t.Fatal(err)
	}
	f, err := b.floorCPU()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the floor: %v of the cluster's CPU per read; from a client %v", f.set, f.client)
	// Issue 28 measured 0.10-0.13 ms; a read's rows cannot cost under a
	// microsecond, nor 10 ms on any machine this runs on. The same rows
	// from a client cost more (measured 1.6 to 1.9 times).
	for _, per := range []time.Duration{f.set, f.client} {
		if per < time.Microsecond || per > 10*time.Millisecond {
			t.Fatalf("the floor counted %v per read", per)
		}
	}
	if f.client <= f.set {
		t.Errorf("the rows from a client, a statement each, cost %v a read, the set-based floor %v", f.client, f.set)
	}
	floor := f.set

	r := &report{floor: floorFigure{set: floor, client: 2 * floor}, cases: []tcase{
		{id: "pg2-1", label: "accepted, 1 user, postgres, 2 instances", pg: &pgDatabase{}},
		{id: "pg2-N", label: "accepted, 1,000 users, postgres, 2 instances", pg: &pgDatabase{}},
		{id: "bolt-1", label: "accepted, 1 user, bolt, 1 instance"},
	}, samples: map[string][]sample{
		"pg2-1": {{rps: 1000, pgCPU: 1000 * 1.2 * floor.Seconds()}},
		"pg2-N": {{rps: 1000, pgCPU: 1000 * 3 * floor.Seconds()}},
	}}
	var out bytes.Buffer
	r.printFloor(&out)
	t.Log("\n" + out.String())
	lines := strings.Split(out.String(), "\n")
	find := func(label string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, label) {
				return l
			}
		}
		t.Fatalf("no line for %q in:\n%s", label, out.String())
		return ""
	}
	if l := find("accepted, 1 user, postgres"); !strings.Contains(l, "1.20") || !strings.Contains(l, "≤ 1.5") || !strings.Contains(l, "0.60") || !strings.HasSuffix(l, " met") {
		t.Errorf("1.2 times the floor: %q", l)
	}
	if l := find("accepted, 1,000 users, postgres"); !strings.Contains(l, "3.00") || !strings.Contains(l, "1.50") || !strings.HasSuffix(l, "NOT MET") {
		t.Errorf("3 times the floor: %q", l)
	}
	if strings.Contains(out.String(), "bolt") {
		t.Errorf("a bolt case set against PostgreSQL's floor:\n%s", out.String())
	}
}
