package api

import (
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/guard"
)

// modelSet is the two models a read may go to, each with its price in
// time: a call is reserved and settled at the price in force on its
// ledger day (choice.day, ocr.Price.On).
type modelSet struct {
	primary       string
	primaryPrice  ocr.Price
	fallback      string // "" when ocr.fallback_model is not set
	fallbackPrice ocr.Price
}

// choice is where a read may go: one model at its price on day, or (soft)
// the primary or the fallback of m, which the brake decides with the
// read's claim.
type choice struct {
	m     *modelSet
	day   string // the ledger day the read is claimed on
	model string
	price ocr.Price // on day
	soft  bool
}

// choose is where r's read may go: the primary model, or the fallback for
// a plan that always takes it; for a plan on "auto", when
// ocr.fallback_model is set, either, as the soft ceilings of [budget]
// decide with its claim (reserve, then decided). The hard ceilings are
// the guard's: a read that goes to the fallback is refused by them as
// any other, at the fallback's worst case.
//
// now is when the read is claimed (Reserve's now), whose day in the
// budget's zone is the ledger day its call counts on: its price is that
// day's.
func (s *Server) choose(r *ocrRequest, now time.Time) choice {
	m := s.models.Load()
	day := s.calendar.Day(now)
	s.notePriceDay(m, day)
	switch {
	case m.fallback == "" || r.plan.Model == budget.PlanModelPrimary:
		return choice{m: m, day: day, model: m.primary, price: m.primaryPrice.On(day)}
	case r.plan.Model == budget.PlanModelFallback:
		return choice{m: m, day: day, model: m.fallback, price: m.fallbackPrice.On(day)}
	}
	return choice{m: m, day: day, model: m.primary, price: m.primaryPrice.On(day), soft: true}
}

// notePriceDay logs, at the first read of a day on which a model's price
// changed, the price it counts from then on.
func (s *Server) notePriceDay(m *modelSet, day string) {
	last := s.priceDay.Load()
	switch {
	case last != nil && *last >= day:
		return // not a new day
	case !s.priceDay.CompareAndSwap(last, &day):
		return // another read of the day logs it
	case last == nil:
		return // the first read since the start, which logged the prices
	}
	for _, side := range []struct {
		model string
		price ocr.Price
	}{{m.primary, m.primaryPrice}, {m.fallback, m.fallbackPrice}} {
		before, now := side.price.On(*last), side.price.On(day)
		if side.model == "" || before.InputUSDPerMillion == now.InputUSDPerMillion && before.OutputUSDPerMillion == now.OutputUSDPerMillion {
			continue
		}
		s.log.Warn("price change: calls are counted at the model's new list price from today", "model", side.model, "day", day,
			"input_usd_per_million", now.InputUSDPerMillion, "output_usd_per_million", now.OutputUSDPerMillion,
			"was_input_usd_per_million", before.InputUSDPerMillion, "was_output_usd_per_million", before.OutputUSDPerMillion)
	}
}

// reserve is Admission.Reserve at the worst case for img of the model c
// goes to or, for a soft choice, ReserveSoft at the worst cases of both.
func (s *Server) reserve(a *guard.Admission, c choice, img ocr.Image, now time.Time) *guard.Refusal {
	worst := c.price.WorstCase(img.Width, img.Height)
	if !c.soft {
		return a.Reserve(worst, now)
	}
	return a.ReserveSoft(worst, c.m.fallbackPrice.On(c.day).WorstCase(img.Width, img.Height), now)
}

// decided is the model a read goes to and its price on the read's day,
// once its claim is committed: for a soft choice, the side of the soft line its claim was
// decided on (the brake's view, Soft, when the brake failed open and
// decided nothing). The first read on a side raises the alert of
// entering or leaving degraded mode.
func (s *Server) decided(a *guard.Admission, c choice, now time.Time) (string, *ocr.Price) {
	if !c.soft {
		return c.model, &c.price
	}
	side, newSide, ok := a.Side()
	if !ok {
		side = s.d.Budget.Soft(now)
	}
	m := c.m
	switch {
	case !newSide:
	case side != "":
		s.log.Warn("degraded mode: reads go to the fallback model", "ceiling", side, "fallback_model", m.fallback)
		s.alert(detect.KindDegraded, detect.DegradedSummary(side, m.fallback),
			map[string]string{"ceiling": side, "model": m.primary, "fallback_model": m.fallback})
	default:
		s.log.Info("degraded mode over: reads go to the primary model", "model", m.primary)
		s.alert(detect.KindRestored, detect.RestoredSummary(m.primary),
			map[string]string{"model": m.primary, "fallback_model": m.fallback})
	}
	if side != "" {
		p := m.fallbackPrice.On(c.day)
		return m.fallback, &p
	}
	return m.primary, &c.price
}
