package ocr

import (
	"fmt"
	"time"
)

// Prices move on announced days: a model's list price is a series of
// periods, each from its first day (in budget.timezone) until the next
// one's. A call is reserved and settled at the price in force on its
// ledger day (Price.On), so the day's figures, warnings, soft lines and
// the brake count each day at that day's price, and a change takes effect
// at midnight without anyone editing the config.

// PricePeriod is a list price from a first day on.
type PricePeriod struct {
	// From is the period's first day, "2006-01-02" in budget.timezone.
	From                string
	InputUSDPerMillion  float64
	OutputUSDPerMillion float64
}

// ChangeWarningDays is how long before a known price change config check
// and serve warn of it.
const ChangeWarningDays = 14

// dayLayout is how a period's first day is written.
const dayLayout = "2006-01-02"

// PriceOn is m's list price on day ("2006-01-02"): its first period's
// before the second begins, then each period's from its first day.
func (m ModelInfo) PriceOn(day string) (in, out float64) {
	in, out = m.InputUSDPerMillion, m.OutputUSDPerMillion
	for _, p := range m.Later {
		if p.From > day {
			break
		}
		in, out = p.InputUSDPerMillion, p.OutputUSDPerMillion
	}
	return in, out
}

// On is p as charged on day ("2006-01-02"): the prices of the period in
// force then, for each price not set in [ocr.price]. A call's price is
// looked up on its ledger day, once, and kept for its reservation, its
// retry and its settlement.
func (p Price) On(day string) Price {
	for _, c := range p.later {
		if c.From > day {
			break
		}
		if !p.fixedIn {
			p.InputUSDPerMillion = c.InputUSDPerMillion
		}
		if !p.fixedOut {
			p.OutputUSDPerMillion = c.OutputUSDPerMillion
		}
	}
	p.later = nil
	return p
}

// NextChange is the first change of p's prices after day, and whether
// one is known: a period whose prices differ from day's in a price
// [ocr.price] leaves to the table.
func (p Price) NextChange(day string) (PricePeriod, bool) {
	now := p.On(day)
	for _, c := range p.later {
		if c.From <= day {
			continue
		}
		next := p.On(c.From)
		if next.InputUSDPerMillion != now.InputUSDPerMillion || next.OutputUSDPerMillion != now.OutputUSDPerMillion {
			return PricePeriod{From: c.From, InputUSDPerMillion: next.InputUSDPerMillion, OutputUSDPerMillion: next.OutputUSDPerMillion}, true
		}
	}
	return PricePeriod{}, false
}

// daysUntil is how many days from day to next, two "2006-01-02" days.
func daysUntil(day, next string) int {
	a, errA := time.Parse(dayLayout, day)
	b, errB := time.Parse(dayLayout, next)
	if errA != nil || errB != nil {
		return 0
	}
	return int(b.Sub(a).Hours() / 24)
}

// PriceOutlook says, for config check and serve's start, the price a
// call to model is charged on day and the next known change of it, with
// warn true when that change is at most ChangeWarningDays away. ok is
// false for a model c does not know.
func (c Config) PriceOutlook(model, day string) (line string, warn, ok bool) {
	p, ok := c.PriceOf(model)
	if !ok {
		return "", false, false
	}
	now := p.On(day)
	line = fmt.Sprintf("%s on %s: $%g in / $%g out per million tokens", model, day, now.InputUSDPerMillion, now.OutputUSDPerMillion)
	next, changes := p.NextChange(day)
	if !changes {
		return line + "; no change known", false, true
	}
	days := daysUntil(day, next.From)
	line += fmt.Sprintf("; from %s (in %d days): $%g in / $%g out, which the ledger counts from that day on by itself",
		next.From, days, next.InputUSDPerMillion, next.OutputUSDPerMillion)
	return line, days <= ChangeWarningDays, true
}
