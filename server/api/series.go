package api

import (
	"breakwater/detect"
	"breakwater/server/guard"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
)

// failOpenLayers are the layers that can fail open: the guard's rate
// limit, daily line and brake, the invite limits, and the dashboard's
// refusal counts, whose writes the write-behind reports like a layer's.
var failOpenLayers = []string{guard.LayerRate, guard.LayerAttempts, guard.LayerBudget, invites.Layer, RefusalCountsLayer}

// RefusalCountsLayer names today's refusal counts in the write-behind's
// fail-open reports.
const RefusalCountsLayer = "refusal_counts"

// alertKinds are the immediate alerts the service raises.
var alertKinds = []string{detect.KindBrakeEngaged, detect.KindUsageCommitFailed, detect.KindFailOpen,
	detect.KindInviteNet, detect.KindUpstreamKeyRefused, detect.KindUpstreamSpendCap, detect.KindUpstreamCredits,
	detect.KindUpstreamModel, detect.KindUpstreamBilling, detect.KindUpstreamRateLimited}

// inviteReasons are the reasons of breakwater_invite_refusals_total.
var inviteReasons = []string{reasonInvalid, reasonExpired, reasonUsedUp, reasonRevoked,
	"rate", "burst", "cooldown", "in_flight", "global", "capacity"}

// startAtZero creates every known label set of the counters at zero, so
// that each series exists from start and an alert rule on it needs no
// absent() (breakwater_refusals_total's are the edge's: knownRefusals).
func (m *Metrics) startAtZero() {
	for _, kind := range alertKinds {
		m.alertsRaised.WithLabelValues(kind)
	}
	for _, reason := range upstreamReasons {
		m.upstreamFailures.WithLabelValues(reason)
	}
	for _, layer := range failOpenLayers {
		m.failOpen.WithLabelValues(layer)
	}
	for _, kind := range []string{"prompt", "output", "thoughts"} {
		m.tokens.WithLabelValues(kind)
	}
	for _, reason := range inviteReasons {
		m.inviteRefusals.WithLabelValues(reason)
	}
	for _, reason := range append(jwtauth.Reasons(), "other") {
		m.jwt.WithLabelValues(reason)
	}
}
