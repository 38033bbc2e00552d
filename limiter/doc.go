// Package limiter provides layer 1 of Breakwater: an exact sliding-window
// rate limit with a burst limit, keyed by a string (a user id, or a client
// IP on pre-auth endpoints), kept in memory. For pre-auth endpoints it also
// provides [FailLimiter], a fail limit: consecutive failures on a key start
// a cooldown (optionally doubling), with a service-wide net on failures per
// hour.
//
// # Exactness
//
// A [Limiter] keeps, per key, a sliding log of the most recent admitted
// timestamps (a ring of at most max(Rate, Burst) entries). A request at time
// t is admitted when, counting it, no half-open interval [a, a+Window) holds
// more than Rate admitted requests and no half-open interval [a, a+1s) holds
// more than Burst. Equivalently, a request at t sees the window (t-Window, t]:
// an earlier request admitted at exactly t-Window has already left it, one
// admitted at t-Window+1ns has not.
//
// The limiter is not a fixed window and not an approximate two-bucket counter:
// it refuses a request only when admitting it would break one of the two
// limits, and [Refusal.RetryAfter] is exactly the time until that stops being
// so.
//
// # Resolution
//
// To keep a key small (about 0.5 KiB at Rate 100 with a full history, see
// BenchmarkMemoryPerKey), timestamps are stored as 32-bit offsets in
// microseconds ([Resolution]) from a per-key base, rounded up. Rounding up
// only ever makes a stored request leave its window later, never earlier, so
// the limits can never be exceeded; the price is that a slot may free up to
// 1µs later than it would with nanosecond timestamps. Decisions compare the
// caller's full-precision now with the stored times, and RetryAfter is exact
// with respect to the stored times. Because of the 32-bit offsets, Window is
// at most [MaxWindow].
//
// # Time
//
// Time is an input: every method takes now. Times are measured with
// now.Sub from the first now the Limiter sees, so values from time.Now are
// compared on the monotonic clock and a step of the wall clock does not move
// any window. If times without a monotonic reading (tests, or a clock that is
// stepped) go backwards, the limiter does not fail and admits nothing extra
// on its own timeline, which never runs backwards: a request is checked
// against every stored request newer than now-Window, including those stored
// "in the future", and is recorded no earlier than the newest stored one.
// A key whose newest request is in the future waits for the clock to catch
// up, and RetryAfter says so.
//
// # What it does not do
//
// It does not persist anything itself: [Limiter.Dirty] and [Limiter.Load]
// hand encoded state to a caller that writes it behind. It does not count
// refused requests; a refusal changes no state, so turning a request away
// costs no write.
//
// # Shared limits
//
// It does not talk to a database itself either. Processes that serve one
// service share their limits through a store that implements
// [SharedWindows] or [SharedFails] ([Limiter.Share], [FailLimiter.Share]):
// the store then decides every key with the semantics above, and the
// memory keeps this process's own decisions beside it. When the store
// cannot decide, the memory decides, as a defense layer fails open, and
// the fault is reported to the caller's hook.
package limiter
