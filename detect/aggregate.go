package detect

import (
	"time"

	"breakwater/limiter"
	"breakwater/storage"
)

// Routes whose statistics events detection reads.
const (
	// RouteInvite is the route of invite checks. Their events carry the
	// refusal reason as Outcome ("invalid", "cooldown", ...) or "ok", the
	// client IP and the submitted e-mail as UserID.
	RouteInvite = "/v1/invites/verify"
	// OutcomeCooldownStarted marks the event that a failed invite check
	// started a cooldown: one per cooled-down key, with either IP or
	// UserID (the e-mail) set. It is not a check of its own; the brute-
	// force detector counts these, not the refusals during a cooldown
	// (an attacker who waits each cooldown out makes none of those).
	OutcomeCooldownStarted = "cooldown_started"
)

// DayBounds returns the first instant of day (a "2006-01-02" in loc) and
// the first of the next: 24 hours apart, or 23 or 25 across a change of
// daylight saving time.
func DayBounds(day string, loc *time.Location) (from, to time.Time, err error) {
	d, err := time.ParseInLocation("2006-01-02", day, loc)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	return d, time.Date(d.Year(), d.Month(), d.Day()+1, 0, 0, 0, 0, loc), nil
}

// addDays moves a "2006-01-02" day by n calendar days.
func addDays(day string, n int) string {
	d, err := time.Parse("2006-01-02", day)
	if err != nil {
		return day
	}
	return d.AddDate(0, 0, n).Format("2006-01-02")
}

// Lines are the daily abuse lines in force, for the grey zone.
type Lines struct {
	ByPlan map[string]int64 // plan name to its daily line (0: none)
	// ByUser is each stored user's line by their plan now: the fallback
	// for events that carry no plan (recorded by older versions).
	ByUser map[string]int64
}

// of returns the line for user whose last event of the day was made under
// plan ("" if it carries none). JWT users are known only by their events.
func (l Lines) of(user, plan string) int64 {
	if line, ok := l.ByPlan[plan]; ok && plan != "" {
		return line
	}
	return l.ByUser[user]
}

// Aggregate sums one day's statistics events per user, per IP, per
// submitted invite e-mail and for the whole service. Each user's daily
// abuse line comes from the plan of their last event that day, or, for
// events without one, from lines.ByUser (missing or 0: none).
//
// Every event not on RouteInvite is an OCR attempt that reached the
// upstream; outcome "ok" is a success and anything else a failure.
func Aggregate(day string, events []storage.Event, lines Lines) storage.DayStats {
	s := storage.DayStats{Day: day, Users: map[string]storage.UserDay{}, IPs: map[string]storage.IPDay{}, Emails: map[string]storage.IPDay{}}
	userIPs := map[string]map[string]bool{}
	ipUsers := map[string]map[string]bool{}
	users, ips := map[string]bool{}, map[string]bool{}
	plans := map[string]string{} // user to the plan of their last event
	for _, e := range events {
		if e.Route == RouteInvite && e.Outcome == OutcomeCooldownStarted {
			if e.IP != "" {
				d := s.IPs[limiter.ClientKey(e.IP)]
				d.InviteCooldowns++
				s.IPs[limiter.ClientKey(e.IP)] = d
			}
			if e.UserID != "" {
				d := s.Emails[e.UserID]
				d.InviteCooldowns++
				s.Emails[e.UserID] = d
			}
			continue
		}
		if e.Route == RouteInvite {
			s.Service.Invites++
			if e.Outcome == "ok" {
				continue
			}
			count := func(m map[string]storage.IPDay, key string) {
				if key == "" {
					return
				}
				d := m[key]
				d.InviteFailures++
				m[key] = d
			}
			count(s.IPs, limiter.ClientKey(e.IP))
			count(s.Emails, e.UserID)
			continue
		}
		s.Service.Attempts++
		s.Service.CostMicroUSD += e.CostMicroUSD
		ok := e.Outcome == "ok"
		if ok {
			s.Service.Successes++
		} else {
			s.Service.Failures++
		}
		ip := limiter.ClientKey(e.IP)
		if ip != "" {
			ips[ip] = true
			d := s.IPs[ip]
			d.Attempts++
			s.IPs[ip] = d
		}
		if e.UserID == "" {
			continue
		}
		users[e.UserID] = true
		if e.Plan != "" {
			plans[e.UserID] = e.Plan
		}
		u := s.Users[e.UserID]
		u.Attempts++
		if ok {
			u.Successes++
		} else {
			u.Failures++
		}
		u.Bytes += e.Bytes
		u.PromptTokens += int64(e.PromptTokens)
		u.OutputTokens += int64(e.OutputTokens)
		u.CostMicroUSD += e.CostMicroUSD
		s.Users[e.UserID] = u
		if ip != "" {
			addPair(userIPs, e.UserID, ip)
			addPair(ipUsers, ip, e.UserID)
		}
	}
	for id, u := range s.Users {
		u.IPs = int64(len(userIPs[id]))
		u.Line = lines.of(id, plans[id])
		s.Users[id] = u
	}
	for ip, d := range s.IPs {
		d.Users = int64(len(ipUsers[ip]))
		s.IPs[ip] = d
	}
	s.Service.Users, s.Service.IPs = int64(len(users)), int64(len(ips))
	return s
}

func addPair(m map[string]map[string]bool, a, b string) {
	if m[a] == nil {
		m[a] = map[string]bool{}
	}
	m[a][b] = true
}
