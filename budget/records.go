package budget

import "time"

// The money records: what a paid read leaves behind, and the global
// budget's ledger. The budget declares them and a storage backend keeps
// them; the field names are the stored encoding of UsageRecord (JSON), so
// renaming one changes what existing databases read back.

// UsageRecord is one successful paid read, written with its quota increment.
type UsageRecord struct {
	Time             time.Time // when the read completed; required
	UserID           string    // required
	KeyID            string    // the API key's id; "jwt" for JWT callers
	RequestID        string
	Model            string
	Outcome          string
	Bytes            int64 // image bytes sent upstream
	PromptTokens     int
	CandidatesTokens int
	ThoughtsTokens   int
	CostMicroUSD     int64 // price of the call, in millionths of a US dollar
	LatencyMS        int64 // upstream latency, in milliseconds

	// Answer, when set, is kept in the same durable transaction as the
	// record, so that a repeat of the request is answered again without a
	// second call. It is not part of the usage row.
	Answer *Answer `json:"-"`
}

// Answer is what a read's usage transaction keeps so that the same request
// (by its idempotency key) or the same image (within the dedupe window)
// is answered again without a second paid call, and never the one without
// the other: a crash cannot leave a charged read without its answer.
type Answer struct {
	// Fingerprint is the SHA-256 of the declared media type and the image
	// bytes.
	Fingerprint [32]byte
	// IdempotencyKey is the client's Idempotency-Key ("" if it sent none);
	// with it, Status and Body are the answer as sent, to be replayed byte
	// for byte.
	IdempotencyKey string
	Status         int
	Body           []byte
	// Serials, Rejected and Simulated are the read, for the dedupe window.
	Serials   []string
	Rejected  []string
	Simulated bool
}

// Settlement replaces a claim's worst case by its actual cost in the
// ledger. Without an ID it moves Day: the call is added to Day's requests
// unless Leased (a lease already counted it), and Day's spend moves from
// LeasedMicroUSD (the part of its cost a lease already counted: its worst
// case, or 0 for a call whose claim was never written) to ActualMicroUSD.
// A call whose claim was never written (layer 3 failed open, or its
// ceilings were off) is thus added to Day whole, so the ledger still
// learns of it. ID is an open reservation row of an earlier version,
// settled the same way and removed. A zero Settlement settles nothing.
type Settlement struct {
	ID             uint64
	Day            string // the claim's day ("2006-01-02"), used when ID is 0
	ActualMicroUSD int64
	Leased         bool
	LeasedMicroUSD int64
}

// DayTotals is one day's totals of the global budget's ledger.
type DayTotals struct {
	Requests      int64 // upstream calls claimed that day, plus the unused rest of leases
	SpendMicroUSD int64 // settled costs, open claims at worst case, and the unused rest of leases
}

// LedgerDay is one day of the ledger with its totals, for charts.
type LedgerDay struct {
	Day string // "2006-01-02"
	DayTotals
}

// Ceilings are the global budget's ceilings in integer units, as a shared
// ledger checks them; 0 means off.
type Ceilings struct {
	DailyRequests   int64
	DailyMicroUSD   int64
	MonthlyMicroUSD int64
}

// SharedTotals are a day's and its month's totals in a shared ledger, as a
// lease left them: every instance's calls, claims and leases.
type SharedTotals struct {
	DayTotals
	// SettledMicroUSD is the day's settled costs alone: the money spent,
	// without the worst cases of calls in flight and leases' rests.
	SettledMicroUSD int64
	// SettledCalls is the day's settled calls alone: the calls made, as
	// the figures shown count them.
	SettledCalls  int64
	MonthMicroUSD int64
	// MonthSettledMicroUSD is the month's settled costs alone, as
	// SettledMicroUSD is the day's.
	MonthSettledMicroUSD int64
	// DeadMicroUSD is the part of the day's gap (micro-dollars counted,
	// not settled) that instances no longer alive hold: the rest of a
	// crashed instance's lease and its calls in flight at the crash. It
	// will never settle, so it counts as spent, not in flight.
	DeadMicroUSD int64
}
