package budget

import (
	"sync/atomic"
	"time"
)

// SharedDaily counts an [Attempts]' daily line in a store that several
// processes share (a guarded route's line on PostgreSQL), so that a
// client alternating between instances gets the line once.
type SharedDaily interface {
	// Take counts one attempt of key on day ("2006-01-02") against line
	// (0: no line), unless the count already reaches it: taken reports
	// which. An error means the store could not decide.
	Take(key, day string, line int64) (taken bool, err error)
}

// sharedDaily is a store and where its faults go.
type sharedDaily struct {
	store   SharedDaily
	onFault func(error)
}

// sharedAttempts is where an Attempts' store is kept.
type sharedAttempts = atomic.Pointer[sharedDaily]

// Share makes store count a's attempts from the next Take on; onFault
// (nil: none) is told of every attempt the store could not decide, which
// a then decided in memory (a defense layer fails open). The memory keeps
// the attempts this process counted and the lines the store refused, so
// that Check still answers from memory and the fallback starts from this
// process's view. A nil store goes back to memory alone.
func (a *Attempts) Share(store SharedDaily, onFault func(error)) {
	if store == nil {
		a.shared.Store(nil)
		return
	}
	a.shared.Store(&sharedDaily{store: store, onFault: onFault})
}

// takeShared is Take with a store. Without a line there is nothing to
// decide across processes: the attempt is counted in memory alone.
func (a *Attempts) takeShared(sh *sharedDaily, user string, line int64, now time.Time) error {
	if line <= 0 {
		return a.takeLocal(user, line, now)
	}
	day := a.cal.Day(now)
	taken, err := sh.store.Take(user, day, line)
	if err != nil {
		if sh.onFault != nil {
			sh.onFault(err)
		}
		return a.takeLocal(user, line, now)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rollover(day)
	if !taken {
		if day == a.day {
			a.count[user] = max(a.count[user], line) // Check refuses it from memory now
		}
		return &LineError{RetryAfter: nextDay(now, a.loc).Sub(now)}
	}
	if day == a.day {
		a.count[user]++
		a.dirty[user] = true
	}
	return nil
}
