package api

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
)

// RateLimitRun is how many reads in a row, with no success between,
// refused for the upstream's rate or tier limit (each after its one
// retry) raise upstream_rate_limited: one such 429 is the upstream's own
// back-off and no alert.
const RateLimitRun = 5

// upstreamReasons are the reasons of breakwater_upstream_failures_total
// that exist from start at 0; the upstream's other status words are added
// as they are seen.
var upstreamReasons = []string{ocr.ReasonAuth, ocr.ReasonSpendCap, ocr.ReasonCredits, ocr.ReasonModelNotFound, ocr.ReasonBilling,
	ocr.ReasonRateLimited, ocr.ReasonTimeout, ocr.ReasonTransport, ocr.ReasonBadOutput, ocr.ReasonBlocked, ocr.ReasonUnknown}

// refusalKinds are the alert kinds of the upstream refusals that stop
// every read, by reason.
var refusalKinds = map[string]string{
	ocr.ReasonAuth: detect.KindUpstreamKeyRefused, ocr.ReasonSpendCap: detect.KindUpstreamSpendCap,
	ocr.ReasonCredits: detect.KindUpstreamCredits, ocr.ReasonModelNotFound: detect.KindUpstreamModel,
	ocr.ReasonBilling: detect.KindUpstreamBilling,
}

func newUpstreamFailures() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_upstream_failures_total",
		Help: "Failed upstream calls by reason: auth, spend_cap, credits_depleted, model_not_found, billing, rate_limited, timeout, transport, bad_output, blocked, or the upstream's status word.",
	}, []string{"reason"})
}

// ReasonOf is the reason of a failed upstream call, as metrics and logs
// name it.
func ReasonOf(err error) string {
	var ue *ocr.UpstreamError
	if errors.As(err, &ue) && ue.Reason != "" {
		return ue.Reason
	}
	return ocr.ReasonUnknown
}

// noteUpstream counts one upstream call's outcome and raises the alerts
// it calls for: at once for a refusal that stops every read, and for a
// run of RateLimitRun rate-limited calls.
func (s *Server) noteUpstream(err error) {
	if err == nil {
		s.rateRun.Store(0)
		return
	}
	reason := ReasonOf(err)
	s.d.Metrics.upstreamFailures.WithLabelValues(reason).Inc()
	if kind, ok := refusalKinds[reason]; ok {
		s.alert(kind, detect.UpstreamSummary(kind), map[string]string{"reason": reason, "error": err.Error()})
		return
	}
	if reason != ocr.ReasonRateLimited {
		return
	}
	if n := s.rateRun.Add(1); n >= RateLimitRun {
		s.alert(detect.KindUpstreamRateLimited, detect.UpstreamSummary(detect.KindUpstreamRateLimited),
			map[string]string{"reason": reason, "calls in a row": strconv.FormatInt(n, 10)})
	}
}

// Figures are the global budget's figures shown (what was made: settled
// calls and spend) as detect's alerts read them.
func Figures(st budget.Status) detect.BudgetFigures {
	return detect.BudgetFigures{
		Day: st.Day, Month: st.Month, Calls: st.Requests, DayMicroUSD: st.SpendMicroUSD, MonthMicroUSD: st.MonthMicroUSD,
		DailyRequests: st.DailyRequests, DailyMicroUSD: st.DailyMicroUSD, MonthlyMicroUSD: st.MonthlyMicroUSD,
	}
}

// CountedFigures are the figures the brake decides on (calls in flight
// included, at their worst case for the money), as the early warnings and
// the brake's alert read them: on PostgreSQL every instance's.
func CountedFigures(c budget.Counted) detect.BudgetFigures {
	return detect.BudgetFigures{
		Day: c.Day, Month: c.Month, Calls: c.Requests, DayMicroUSD: c.SpendMicroUSD, MonthMicroUSD: c.MonthMicroUSD,
		DailyRequests: c.DailyRequests, DailyMicroUSD: c.DailyMicroUSD, MonthlyMicroUSD: c.MonthlyMicroUSD,
	}
}
