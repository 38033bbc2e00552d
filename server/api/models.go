package api

import (
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/guard"
)

// modelSet is the two models a read may go to, each with the price its
// calls are reserved and settled at.
type modelSet struct {
	primary       string
	primaryPrice  ocr.Price
	fallback      string // "" when ocr.fallback_model is not set
	fallbackPrice ocr.Price
}

// choice is where a read may go: one model at its price, or (soft) the
// primary or the fallback of m, which the brake decides with the read's
// claim.
type choice struct {
	m     *modelSet
	model string
	price *ocr.Price
	soft  bool
}

// choose is where r's read may go: the primary model, or the fallback for
// a plan that always takes it; for a plan on "auto", when
// ocr.fallback_model is set, either, as the soft ceilings of [budget]
// decide with its claim (reserve, then decided). The hard ceilings are
// the guard's: a read that goes to the fallback is refused by them as
// any other, at the fallback's worst case.
func (s *Server) choose(r *ocrRequest) choice {
	m := s.models.Load()
	switch {
	case m.fallback == "" || r.plan.Model == budget.PlanModelPrimary:
		return choice{m: m, model: m.primary, price: &m.primaryPrice}
	case r.plan.Model == budget.PlanModelFallback:
		return choice{m: m, model: m.fallback, price: &m.fallbackPrice}
	}
	return choice{m: m, model: m.primary, price: &m.primaryPrice, soft: true}
}

// reserve is Ticket.Reserve at the worst case for img of the model c
// goes to or, for a soft choice, ReserveSoft at the worst cases of both.
func (s *Server) reserve(t *guard.Ticket, c choice, img ocr.Image, now time.Time) *guard.Refusal {
	worst := c.price.WorstCase(img.Width, img.Height)
	if !c.soft {
		return t.Reserve(worst, now)
	}
	return t.ReserveSoft(worst, c.m.fallbackPrice.WorstCase(img.Width, img.Height), now)
}

// decided is the model a read goes to and its price, once its claim is
// committed: for a soft choice, the side of the soft line its claim was
// decided on (the brake's view, Soft, when the brake failed open and
// decided nothing). The first read on a side raises the alert of
// entering or leaving degraded mode.
func (s *Server) decided(t *guard.Ticket, c choice, now time.Time) (string, *ocr.Price) {
	if !c.soft {
		return c.model, c.price
	}
	side, newSide, ok := t.Side()
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
		return m.fallback, &m.fallbackPrice
	}
	return m.primary, &m.primaryPrice
}
