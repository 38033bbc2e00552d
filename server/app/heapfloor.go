package app

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// HeapFloor is the least room the collector leaves the heap to grow into
// between two collections, once the serving process holds the floor
// (HoldHeapFloor).
//
// Go starts a collection each time the heap has grown by as much as was
// live after the last one (GOGC=100), and at least every 4 MiB. A
// Breakwater server's live heap is a few MiB, so under load it collected
// 25-30 times a second, each cycle costing 2-3 ms of CPU that hardly
// depends on the heap's size (stacks, roots, the mark workers' start and
// end): about 2.5 µs of a 429's 25-30, as much as its own layers. With
// the floor a cycle comes every 16 MiB of allocation while the live heap
// is smaller than that, a few times a second, and as before once it is
// larger. The price is resident memory: up to 16 MiB more at peak while
// the heap is small, nothing once it has outgrown the floor; what a key or
// a client address adds is, if anything, less while the floor lasts (the
// room does not grow with it).
const HeapFloor = 16 << 20

var holdFloor sync.Once

// HoldHeapFloor keeps HeapFloor of room for the rest of the process: after
// each collection it sets the collector's percentage (as GOGC would) so
// that the next collection comes after HeapFloor of new allocation while
// the live heap is smaller, and at the usual 100% once it is not. Where
// GOGC is set in the environment, the operator's choice stands and
// nothing is held. GOMEMLIMIT, where set, still caps the heap.
func HoldHeapFloor() {
	if os.Getenv("GOGC") != "" {
		return
	}
	holdFloor.Do(func() {
		f := &heapFloor{samples: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
		}}
		f.retune()
		f.watch()
	})
}

// heapFloor is the state of the floor held; only the finalizer goroutine
// uses it once HoldHeapFloor has returned.
type heapFloor struct {
	samples []metrics.Sample
	percent int
}

// retune sets the percentage for the heap the last collection left. The
// collector's room is the percentage of what it scans (the live heap, the
// goroutines' stacks, the globals), so the percentage that makes the room
// HeapFloor is HeapFloor over that.
func (f *heapFloor) retune() {
	metrics.Read(f.samples)
	var scanned uint64
	for _, s := range f.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			scanned += s.Value.Uint64()
		}
	}
	percent := floorPercent(scanned)
	if percent != f.percent {
		debug.SetGCPercent(percent)
		f.percent = percent
	}
}

// floorPercent is the collector's percentage that leaves HeapFloor of room
// over scanned bytes, never less than the usual 100. Nor more than 400:
// the collector's least heap, 4 MiB at 100, grows with the percentage, and
// at 400 it is HeapFloor itself, the goal of any heap under 4 MiB.
func floorPercent(scanned uint64) int {
	const most = HeapFloor * 100 / (4 << 20)
	if scanned == 0 {
		return most
	}
	return int(min(most, max(100, HeapFloor*100/scanned)))
}

// gcSentinel is garbage from its birth: its finalizer runs after the next
// collection. The pointer keeps it off the tiny allocator, whose blocks
// are freed, and finalized, only together.
type gcSentinel struct{ _ *int }

// watch retunes after the next collection, and so after every one.
func (f *heapFloor) watch() {
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
		f.retune()
		f.watch()
	})
}
