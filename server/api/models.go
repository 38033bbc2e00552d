package api

import (
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
)

// modelSet is the two models a read may go to, each with the price its
// calls are reserved and settled at.
type modelSet struct {
	primary       string
	primaryPrice  ocr.Price
	fallback      string // "" when ocr.fallback_model is not set
	fallbackPrice ocr.Price
}

// choose is the model r's read goes to and the price it is reserved and
// settled at: the primary model, or the fallback for a plan that always
// takes it, and for a plan on "auto" while the day is above a soft
// ceiling of [budget]. The hard ceilings are the guard's: a read that
// goes to the fallback is refused by them as any other, at the
// fallback's worst case.
func (s *Server) choose(r *ocrRequest, now time.Time) (string, *ocr.Price) {
	m := s.models.Load()
	if m.fallback == "" {
		return m.primary, &m.primaryPrice
	}
	soft := s.softCeiling(m, now)
	switch r.plan.Model {
	case budget.PlanModelPrimary:
		return m.primary, &m.primaryPrice
	case budget.PlanModelFallback:
		return m.fallback, &m.fallbackPrice
	}
	if soft != "" {
		return m.fallback, &m.fallbackPrice
	}
	return m.primary, &m.primaryPrice
}

// softCeiling is the soft ceiling the day is above ("" for none). The
// first read that finds the day on the other side of the line than the
// read before it raises the alert of entering or leaving degraded mode.
func (s *Server) softCeiling(m *modelSet, now time.Time) string {
	side := s.d.Budget.Soft(now)
	prev := s.softSide.Swap(&side)
	switch {
	case *prev == side:
	case side != "":
		s.log.Warn("degraded mode: reads go to the fallback model", "ceiling", side, "fallback_model", m.fallback)
		s.alert(detect.KindDegraded, detect.DegradedSummary(side, m.fallback),
			map[string]string{"ceiling": side, "model": m.primary, "fallback_model": m.fallback})
	default:
		s.log.Info("degraded mode over: reads go to the primary model", "model", m.primary)
		s.alert(detect.KindRestored, detect.RestoredSummary(m.primary),
			map[string]string{"model": m.primary, "fallback_model": m.fallback})
	}
	return side
}
