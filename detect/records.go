package detect

import (
	"errors"
	"time"
)

// The records of layer 4: the statistics events the Recorder writes, the
// daily aggregates and findings the Runner stores, the record of each run
// and when each alert kind was last sent. Detection declares them and a
// storage backend keeps them; the field names (and JSON tags, where
// present) are the stored encoding, so changing one changes what existing
// databases read back.

// ErrNoRun is what Store.LastDetectRun returns, wrapped, when detection
// never ran.
var ErrNoRun = errors.New("detect: detection never ran")

// Event is one statistics event (layer 4), kept apart from billing: it
// records an attempt whatever its outcome, for detection and dashboards.
type Event struct {
	Time   time.Time // when the request finished; required
	UserID string    // the user; on invite checks, the normalised e-mail submitted
	KeyID  string
	Plan   string `json:",omitempty"` // the plan of the request; empty on invite checks and in older events
	IP     string // client IP as resolved by server
	Route  string
	// Layer is the layer that refused the request, or would have in
	// shadow mode, on rows of OutcomeLayerRefused and
	// OutcomeShadowRefused; empty on every other event.
	Layer        string `json:",omitempty"`
	Outcome      string
	Status       int   // HTTP status returned
	Bytes        int64 // request body bytes
	LatencyMS    int64 // total latency, in milliseconds
	PromptTokens int
	OutputTokens int
	CostMicroUSD int64 // upstream cost, in millionths of a US dollar
	// Count is how many occurrences the event stands for: a row that
	// sums several (invite refusals counted in memory) carries their
	// number; 0, as on every single event and in older rows, means one.
	Count int64 `json:",omitempty"`
}

// N is how many occurrences e stands for: Count, or 1 when it is unset.
func (e Event) N() int64 {
	if e.Count > 0 {
		return e.Count
	}
	return 1
}

// UserDay is one user's figures for one day, from the statistics events.
type UserDay struct {
	Attempts     int64 `json:"attempts"`  // OCR attempts that reached the upstream
	Successes    int64 `json:"successes"` // outcome "ok"
	Failures     int64 `json:"failures"`  // any other outcome
	IPs          int64 `json:"ips"`       // distinct client IPs
	Bytes        int64 `json:"bytes"`
	PromptTokens int64 `json:"prompt_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	CostMicroUSD int64 `json:"cost_micro_usd"`
	// Line is the user's daily abuse line when the day was aggregated
	// (0: none); the grey-zone detector compares Attempts with it.
	Line int64 `json:"line"`
	// Cached counts reads answered from storage (the same image again, or
	// a repeated idempotency key): not attempts, no upstream call.
	Cached int64 `json:"cached,omitempty"`
}

// IPDay is one client IP's figures for one day.
type IPDay struct {
	Users           int64 `json:"users"`            // distinct users of OCR from this IP
	Attempts        int64 `json:"attempts"`         // OCR attempts
	InviteFailures  int64 `json:"invite_failures"`  // invite checks refused, for any reason
	InviteCooldowns int64 `json:"invite_cooldowns"` // invite checks refused by a cooldown
	// UserIDs names the first MaxNamedUsers of Users (sorted) when more
	// than one user came from the IP; empty on older rows and on e-mails.
	UserIDs []string `json:"user_ids,omitempty"`
}

// MaxNamedUsers is the most users an IP's figures and a shared_ip
// finding name.
const MaxNamedUsers = 10

// ServiceDay is the whole service's figures for one day.
type ServiceDay struct {
	Attempts     int64 `json:"attempts"`
	Successes    int64 `json:"successes"`
	Failures     int64 `json:"failures"`
	Users        int64 `json:"users"`
	IPs          int64 `json:"ips"`
	CostMicroUSD int64 `json:"cost_micro_usd"`
	Invites      int64 `json:"invites"`          // invite checks, whatever their outcome
	Cached       int64 `json:"cached,omitempty"` // reads answered from storage
}

// DayStats is the aggregate of one day's statistics events.
type DayStats struct {
	Day     string             `json:"day"` // "2006-01-02" in the budget time zone
	Users   map[string]UserDay `json:"users"`
	IPs     map[string]IPDay   `json:"ips"`
	Emails  map[string]IPDay   `json:"emails,omitempty"` // invite figures per submitted e-mail, when events carry one
	Service ServiceDay         `json:"service"`
}

// Finding is one thing a detector noticed on one day.
type Finding struct {
	Day      string             `json:"day"`
	Detector string             `json:"detector"`
	Subject  string             `json:"subject"` // a user id, an IP, an e-mail or "service"
	Figures  map[string]float64 `json:"figures"`
	// Users names the users of a shared_ip finding, at most
	// MaxNamedUsers of them; empty on other findings.
	Users []string `json:"users,omitempty"`
}

// RunRecord records one run of the daily detection.
type RunRecord struct {
	Day      string    `json:"day"`
	RanAt    time.Time `json:"ran_at"`
	Findings int       `json:"findings"`
	Pruned   int       `json:"pruned"` // raw events deleted by this run
	// GaveUp marks a day the scheduler gave up on after runs of it that
	// started and never finished: it has no aggregate, and detection goes
	// on with the next day.
	GaveUp bool `json:"gave_up,omitempty"`
}

// LayerRefusals is how many requests one layer refused (or, Shadow, would
// have refused in shadow mode) over a stretch of time, as the statistics
// events of every instance count them.
type LayerRefusals struct {
	Layer  string
	Shadow bool
	Count  int64
}

// AlertState is when one alert kind was last sent.
type AlertState struct {
	Kind    string    `json:"kind"`
	SentAt  time.Time `json:"sent_at"`
	Summary string    `json:"summary"`
	// Period is the period the sending holds the kind back in: the day
	// (budget.timezone) of an immediate alert, the day or month of an
	// early warning; empty on a re-armed kind and in older records.
	Period string `json:"period,omitempty"`
}
