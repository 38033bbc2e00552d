package detect

import (
	"sync"
	"testing"
)

// A full queue drops and counts; a closed one takes nothing more, and
// what was queued before Close is still there for the consumer.
func TestQueueDropsWhenFullAndAfterClose(t *testing.T) {
	q := newQueue[int](2)
	for i := range 3 {
		if got, want := q.Push(i), i < 2; got != want {
			t.Errorf("Push(%d) = %v, want %v", i, got, want)
		}
	}
	q.Close()
	q.Close() // idempotent
	if q.Push(9) || !q.Closed() {
		t.Error("a closed queue took an item")
	}
	var got []int
	for v := range q.Items() {
		got = append(got, v)
	}
	if len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("drained %v, want [0 1]", got)
	}
	if q.Dropped() != 2 {
		t.Errorf("dropped %d, want 2 (one full, one closed)", q.Dropped())
	}
}

// Push and Close race without a send on a closed channel.
func TestQueuePushRacesClose(t *testing.T) {
	q := newQueue[int](1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				q.Push(i)
			}
		})
	}
	go func() {
		for range q.Items() {
		}
	}()
	q.Close()
	wg.Wait()
}
