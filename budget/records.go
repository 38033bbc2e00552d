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

// Settlement replaces an open reservation's worst case by its actual cost.
// A call whose reservation could not be written (ID 0: layer 3 failed
// open) is added to Day whole, one request and its actual cost, so the
// ledger still learns of it. A zero Settlement settles nothing.
type Settlement struct {
	ID             uint64
	Day            string // the claim's day ("2006-01-02"), used when ID is 0
	ActualMicroUSD int64
}

// DayTotals is one day's totals of the global budget's ledger.
type DayTotals struct {
	Requests      int64 // upstream calls reserved that day
	SpendMicroUSD int64 // settled costs plus open reservations at worst case
}

// LedgerDay is one day of the ledger with its totals, for charts.
type LedgerDay struct {
	Day string // "2006-01-02"
	DayTotals
}
