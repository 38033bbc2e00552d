package edge

import (
	"sync"
	"time"
)

// RefusalLogInterval is the least time between two log lines of
// refusals: anyone can send refusals without end, and each line would be
// disk.
const RefusalLogInterval = time.Second

// LogEvery lets one log line through per interval and counts the lines
// it held back meanwhile, for the next line to report. The zero value is
// ready to use.
type LogEvery struct {
	mu   sync.Mutex
	next time.Time // when the next line may go out
	held int       // lines held back since the last one
}

// Allow reports whether a line may go out at now and, if so, how many
// were held back before it.
func (l *LogEvery) Allow(now time.Time, interval time.Duration) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.held++
		return false, 0
	}
	held, l.held = l.held, 0
	l.next = now.Add(interval)
	return true, held
}
