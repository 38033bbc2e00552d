package app

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"
)

// heapFloorChildEnv makes TestHeapFloorChild measure, in a process of its
// own: "with" the floor held first, "without" it, or "follow" the live
// heap with it.
const heapFloorChildEnv = "BREAKWATER_TEST_HEAP_FLOOR"

// floorGarbage is what each child allocates, in short-lived 4 KiB pieces.
const floorGarbage = 64 << 20

// TestHeapFloor: held, the floor makes collections several times rarer
// for the same garbage while the live heap is small, and it makes no
// memory resident of its own. Each side runs in a fresh process, as the
// server holds the floor at its start.
func TestHeapFloor(t *testing.T) {
	without := floorChild(t, "without")
	with := floorChild(t, "with")
	t.Logf("for %d MiB of garbage: %d collections without the floor (goal %d KiB), %d with it (goal %d KiB); holding it made %d KiB resident",
		floorGarbage>>20, without.collections, without.goal>>10, with.collections, with.goal>>10, with.resident>>10)
	if with.resident > HeapFloor/8 {
		t.Errorf("holding the floor made %d KiB resident, want at most %d", with.resident>>10, HeapFloor/8>>10)
	}
	// The goal is the mechanism, read at a collection's end: it does not
	// depend on how busy the machine is. The count of collections does,
	// a little (a slow mark lets more garbage in per cycle; CI saw 11
	// without the floor where a quiet machine sees 22), so it is held to
	// what the floor allows and to fewer than without.
	if with.goal < HeapFloor || without.goal >= HeapFloor/2 {
		t.Errorf("heap goal %d KiB with the floor, %d KiB without: want at least %d, and under half that",
			with.goal>>10, without.goal>>10, HeapFloor>>10)
	}
	if most := uint32(floorGarbage/HeapFloor + 1); with.collections > most || with.collections >= without.collections {
		t.Errorf("%d collections with the floor against %d without: want at most %d, and fewer", with.collections, without.collections, most)
	}
}

type floorFigures struct {
	resident    int64  // bytes made resident by HoldHeapFloor
	goal        uint64 // the heap goal after a collection with a small live heap
	collections uint32 // for floorGarbage
}

// floorChildCmd runs TestHeapFloorChild on side, without any GOGC of the
// environment's (the floor gives way to one).
func floorChildCmd(side string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHeapFloorChild$", "-test.count=1", "-test.v")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, heapFloorChildEnv+"="+side, "GOMEMLIMIT=off")
	return cmd
}

func floorChild(t *testing.T, side string) floorFigures {
	t.Helper()
	out, err := floorChildCmd(side).CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", side, err, out)
	}
	var f floorFigures
	for line := range strings.Lines(string(out)) {
		if _, err := fmt.Sscanf(line, "FLOOR resident=%d goal=%d collections=%d", &f.resident, &f.goal, &f.collections); err == nil {
			return f
		}
	}
	t.Fatalf("child %s said nothing measured:\n%s", side, out)
	return f
}

// TestHeapFloorChild is TestHeapFloor's measuring child; run alone, it
// does nothing.
func TestHeapFloorChild(t *testing.T) {
	side := os.Getenv(heapFloorChildEnv)
	if side == "" {
		return
	}
	var grown int64
	if side != "without" {
		rss := residentBytes(t)
		HoldHeapFloor()
		HoldHeapFloor() // a second call holds nothing more
		grown = residentBytes(t) - rss
	}
	if side == "follow" {
		followLiveHeap(t)
		return
	}
	runtime.GC()
	goal := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(goal)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range floorGarbage / 4096 {
		sink = make([]byte, 4096)
	}
	runtime.ReadMemStats(&after)
	fmt.Printf("FLOOR resident=%d goal=%d collections=%d\n", grown, goal[0].Value.Uint64(), after.NumGC-before.NumGC)
}

// sink keeps the children's garbage from being optimised away.
var sink []byte

// residentBytes is the process's resident set (/proc/self/statm).
func residentBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// TestFloorPercent: the room is HeapFloor over a small heap, the usual
// 100% over a large one, and the least goal never above the floor.
func TestFloorPercent(t *testing.T) {
	for _, c := range []struct {
		scanned uint64
		want    int
	}{
		{0, 400},                   // the heap's least goal is then the floor
		{1 << 20, 400},             // the same: 4 MiB at 100%, 16 at 400%
		{4 << 20, 400},             // 16 MiB of room over 4 MiB
		{8 << 20, 200},             // over 8 MiB
		{HeapFloor/2 + 1<<10, 199}, // rounded down: the room a little under the floor
		{HeapFloor, 100},           // the floor outgrown
		{HeapFloor * 10, 100},      // never below the usual
	} {
		if got := floorPercent(c.scanned); got != c.want {
			t.Errorf("floorPercent(%d) = %d, want %d", c.scanned, got, c.want)
		}
	}
}

// TestHeapFloorGivesWayToGOGC: with GOGC set, HoldHeapFloor changes
// nothing.
func TestHeapFloorGivesWayToGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	before := debug.SetGCPercent(150)
	defer debug.SetGCPercent(before)
	HoldHeapFloor()
	if got := debug.SetGCPercent(150); got != 150 {
		t.Errorf("GOGC percentage %d after HoldHeapFloor, want the operator's 150", got)
	}
}

// TestHeapFloorFollowsTheLiveHeap: the percentage is set anew after
// collections, so the room stops growing once the live heap has outgrown
// the floor, and comes back when it shrinks.
func TestHeapFloorFollowsTheLiveHeap(t *testing.T) {
	if out, err := floorChildCmd("follow").CombinedOutput(); err != nil || !strings.Contains(string(out), "FOLLOWED") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// followLiveHeap is TestHeapFloorFollowsTheLiveHeap's child, the floor
// held: 400% over a small heap, 100% with 32 MiB live, 400% again once
// they are gone.
func followLiveHeap(t *testing.T) {
	percent := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	await := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for percent() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the collector's percentage is %d, want %d", percent(), want)
			}
			runtime.GC() // the floor is retuned after a collection
			time.Sleep(10 * time.Millisecond)
		}
	}
	await(400)
	live := make([][]byte, 32)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	await(100)
	runtime.KeepAlive(live)
	live = nil
	await(400)
	fmt.Println("FOLLOWED")
}
