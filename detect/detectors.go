package detect

import (
	"slices"
	"sort"
)

// Detector names, as stored in findings.
const (
	DetectorGreyZone = "grey_zone"
	DetectorFailures = "failures"
	DetectorSpike    = "spike"
	DetectorSharedIP = "shared_ip"
	DetectorInvite   = "invite_brute_force"
	DetectorService  = "service_spend"
)

// Ceilings are the global budget's ceilings in force (0: off), for the
// service detector.
type Ceilings struct {
	DailyRequests   int64
	DailyMicroUSD   int64
	MonthlyMicroUSD int64
}

// History is what the detectors look at for one day.
type History struct {
	Today DayStats
	// Before holds aggregates of the 7 days before Today (any order,
	// others ignored); a missing day counts as a day without attempts.
	Before []DayStats
	// MonthCostMicroUSD is the cost of Today's month up to and including
	// Today.
	MonthCostMicroUSD int64
	Ceilings          Ceilings
}

// Detect runs every detector over h with cfg's thresholds (defaults
// applied) and returns the findings, detector by detector, each sorted by
// subject.
func Detect(cfg Config, h History) []Finding {
	cfg = cfg.WithDefaults()
	var out []Finding
	for _, d := range []func(Config, History) []Finding{
		detectGreyZone, detectFailures, detectSpike, detectSharedIP, detectInvite, detectService,
	} {
		found := d(cfg, h)
		sort.SliceStable(found, func(i, j int) bool { return found[i].Subject < found[j].Subject })
		out = append(out, found...)
	}
	return out
}

// previous returns the aggregates of the n days before Today, oldest
// first, with a zero aggregate for a missing day.
func (h History) previous(n int) []DayStats {
	byDay := map[string]DayStats{}
	for _, d := range h.Before {
		byDay[d.Day] = d
	}
	out := make([]DayStats, n)
	for i := range n {
		day := addDays(h.Today.Day, i-n)
		out[i] = byDay[day]
		out[i].Day = day
	}
	return out
}

func finding(h History, detector, subject string, figures map[string]float64) Finding {
	return Finding{Day: h.Today.Day, Detector: detector, Subject: subject, Figures: figures}
}

// detectGreyZone: a user at or above grey_ratio of their daily line on at
// least grey_days of the last 7 days (Today and the 6 before). Only users
// active Today are reported, so a finding is about a current pattern.
func detectGreyZone(cfg Config, h History) []Finding {
	var out []Finding
	days := append(h.previous(6), h.Today)
	for user := range h.Today.Users {
		n := 0
		for _, d := range days {
			u := d.Users[user]
			if u.Line > 0 && float64(u.Attempts) >= cfg.GreyRatio*float64(u.Line) {
				n++
			}
		}
		if n >= cfg.GreyDays {
			u := h.Today.Users[user]
			out = append(out, finding(h, DetectorGreyZone, user, map[string]float64{
				"grey_days": float64(n), "attempts": float64(u.Attempts), "line": float64(u.Line),
			}))
		}
	}
	return out
}

// detectFailures: a user whose failed share of attempts is at least
// fail_ratio, with at least min_attempts attempts.
func detectFailures(cfg Config, h History) []Finding {
	var out []Finding
	for user, u := range h.Today.Users {
		if u.Attempts < cfg.MinAttempts || u.Attempts == 0 {
			continue
		}
		if ratio := float64(u.Failures) / float64(u.Attempts); ratio >= cfg.FailRatio {
			out = append(out, finding(h, DetectorFailures, user, map[string]float64{
				"attempts": float64(u.Attempts), "failures": float64(u.Failures), "fail_ratio": ratio,
			}))
		}
	}
	return out
}

// detectSpike: a user's attempts at least spike_factor times the median of
// their attempts on the 7 days before, the median taken as at least
// spike_floor.
func detectSpike(cfg Config, h History) []Finding {
	var out []Finding
	before := h.previous(7)
	for user, u := range h.Today.Users {
		counts := make([]int64, 0, len(before))
		for _, d := range before {
			counts = append(counts, d.Users[user].Attempts)
		}
		slices.Sort(counts)
		median := counts[len(counts)/2]
		baseline := max(median, cfg.SpikeFloor)
		if float64(u.Attempts) >= cfg.SpikeFactor*float64(baseline) {
			out = append(out, finding(h, DetectorSpike, user, map[string]float64{
				"attempts": float64(u.Attempts), "median_7d": float64(median), "baseline": float64(baseline),
			}))
		}
	}
	return out
}

// detectSharedIP: one IP used by at least ip_users distinct users. Other
// is no IP: its users come from many.
func detectSharedIP(cfg Config, h History) []Finding {
	var out []Finding
	for ip, d := range h.Today.IPs {
		if ip != Other && d.Users >= cfg.IPUsers {
			f := finding(h, DetectorSharedIP, ip, map[string]float64{
				"users": float64(d.Users), "attempts": float64(d.Attempts),
			})
			f.Users = slices.Clone(d.UserIDs)
			out = append(out, f)
		}
	}
	return out
}

// detectInvite: an IP or a submitted e-mail with at least
// invite_cooldowns cooldowns. Other counts too: cooldowns spread over
// more keys than an aggregate keeps are a guessing attack of their own.
func detectInvite(cfg Config, h History) []Finding {
	var out []Finding
	for _, m := range []map[string]IPDay{h.Today.IPs, h.Today.Emails} {
		for subject, d := range m {
			if d.InviteCooldowns >= cfg.InviteCooldowns {
				out = append(out, finding(h, DetectorInvite, subject, map[string]float64{
					"cooldowns": float64(d.InviteCooldowns), "invite_failures": float64(d.InviteFailures),
				}))
			}
		}
	}
	return out
}

// detectService: the day's calls or spend, or the month's spend, at or
// above budget_warn_ratio of the matching global ceiling (ceilings that
// are off are skipped).
func detectService(cfg Config, h History) []Finding {
	var out []Finding
	for _, c := range []struct {
		name           string
		value, ceiling int64
		scale          float64
	}{
		{"daily_requests", h.Today.Service.Attempts, h.Ceilings.DailyRequests, 1},
		{"daily_usd", h.Today.Service.CostMicroUSD, h.Ceilings.DailyMicroUSD, 1e6},
		{"monthly_usd", h.MonthCostMicroUSD, h.Ceilings.MonthlyMicroUSD, 1e6},
	} {
		if c.ceiling <= 0 || float64(c.value) < cfg.BudgetWarnRatio*float64(c.ceiling) {
			continue
		}
		out = append(out, finding(h, DetectorService, "service", map[string]float64{
			c.name: float64(c.value) / c.scale, c.name + "_ceiling": float64(c.ceiling) / c.scale,
			"ratio": float64(c.value) / float64(c.ceiling),
		}))
	}
	return out
}
