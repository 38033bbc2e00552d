package budget_test

import (
	"fmt"
	"time"

	"breakwater/budget"
)

// A read reserves its slot before the upstream call, and is confirmed once
// its usage record is on disk, or released if it failed.
func ExampleQuotas() {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	q := budget.NewQuotas(time.UTC, budget.MonthKey(now, time.UTC), map[string]int64{"alice": 1})

	slot, err := q.Reserve("alice", 2, now) // the last read of a quota of 2
	fmt.Println(err)
	_, err = q.Reserve("alice", 2, now) // a parallel request finds nothing left
	fmt.Println(err)
	// ... the upstream call succeeds and the usage record is committed ...
	fmt.Println(q.Confirm(slot))
	// Output:
	// <nil>
	// budget: monthly quota of 2 used up, resets in 12h0m0s
	// 2
}
