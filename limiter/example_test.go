package limiter_test

import (
	"errors"
	"fmt"
	"time"

	"breakwater/limiter"
)

// A user may make 3 requests a minute, at most 2 in any one second. The
// clock is an input, so the example (like a test) needs no sleeping.
func Example() {
	l, err := limiter.New(limiter.Config{Rate: 3, Window: time.Minute, Burst: 2})
	if err != nil {
		panic(err)
	}
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{
		0,
		100 * time.Millisecond,
		200 * time.Millisecond, // a third within one second
		time.Second,
		2 * time.Second, // a fourth within one minute
		time.Minute,     // the first request has left the window
	} {
		err := l.Allow("user-42", start.Add(at))
		var r *limiter.Refusal
		switch {
		case err == nil:
			fmt.Printf("+%v admitted\n", at)
		case errors.As(err, &r):
			fmt.Printf("+%v refused by the %s limit; Retry-After: %d (exactly %v)\n",
				at, r.Reason, r.RetryAfterSeconds(), r.RetryAfter)
		}
	}
	// Output:
	// +0s admitted
	// +100ms admitted
	// +200ms refused by the burst limit; Retry-After: 1 (exactly 800ms)
	// +1s admitted
	// +2s refused by the rate limit; Retry-After: 58 (exactly 58s)
	// +1m0s admitted
}

// State is written behind and loaded at start, so a restart does not lift a
// cooldown.
func ExampleLimiter_Load() {
	cfg := limiter.Config{Rate: 2, Window: time.Minute}
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)

	before, _ := limiter.New(cfg)
	before.Allow("203.0.113.7", start)
	before.Allow("203.0.113.7", start.Add(time.Second))
	saved := before.Dirty(start.Add(time.Second)) // e.g. every second, to disk

	after, _ := limiter.New(cfg) // the next process
	after.Load(saved, start.Add(5*time.Second))
	fmt.Println(after.Allow("203.0.113.7", start.Add(5*time.Second)))
	fmt.Println(after.Allow("203.0.113.7", start.Add(time.Minute)))
	// Output:
	// limiter: rate limit reached, retry after 55s
	// <nil>
}

// Three wrong guesses in a row start a five-minute cooldown, during which
// even the right code is not looked at. Begin counts the attempt before the
// caller judges it, so parallel guesses cannot slip past the limit.
func ExampleFailLimiter() {
	f, err := limiter.NewFail(limiter.FailConfig{Limit: 3, Window: time.Minute, Cooldown: 5 * time.Minute})
	if err != nil {
		panic(err)
	}
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	keys := []string{"ip:203.0.113.7", "email:ann@example.com"}
	for i, right := range []bool{false, false, false, true, true} {
		now := start.Add(time.Duration(i) * 10 * time.Second)
		if i == 4 {
			now = start.Add(6 * time.Minute)
		}
		a, err := f.Begin(keys, now)
		if err != nil {
			fmt.Printf("%v: refused: %v\n", now.Sub(start), err)
			continue
		}
		if right {
			a.Succeed(now)
			fmt.Printf("%v: right code accepted\n", now.Sub(start))
		} else {
			a.Fail(now)
			fmt.Printf("%v: wrong code\n", now.Sub(start))
		}
	}
	// Output:
	// 0s: wrong code
	// 10s: wrong code
	// 20s: wrong code
	// 30s: refused: limiter: cooldown limit reached, retry after 4m50s
	// 6m0s: right code accepted
}
