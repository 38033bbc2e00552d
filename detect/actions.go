package detect

import "strings"

// What the operator can do about each alert kind: fixed text, shown under
// "What to do:" in the alert's mail and webhook text (docs/OPERATIONS.md
// shows each).
var actions = map[string][]string{
	KindBrakeEngaged: {
		"See the figures: breakwater budget",
		"Release it now: raise the ceiling named above in config.toml [budget] (applied when the file is saved; an explicit 0 switches it off)",
		"Or let it reopen by itself at the time above",
		"If the manual switch holds it (ceiling manual): breakwater brake off",
		"Find the heaviest users: breakwater usage",
	},
	KindUsageCommitFailed: {
		"Check the disk of storage.path: free space, permissions, the server's log",
		"Paid calls resume by themselves once writes succeed",
	},
	KindFailOpen: {
		"Check the server's log for the layer's errors (usually storage)",
	},
	KindInviteNet: {
		"Look at the invite refusals on the dashboard; the net reopens when the hour's failures fall",
	},
	KindUpstreamKeyRefused: {
		"Check GEMINI_API_KEY in the server's environment (a key of the right project, not revoked), then restart",
	},
	KindUpstreamSpendCap: {
		"Raise the project's spend cap in Google AI Studio (its Billing/Spend page); reads resume within minutes",
		"Meanwhile, stop paid calls if you want clients to see 503 rather than 502: breakwater brake on",
	},
	KindUpstreamCredits: {
		"Buy prepaid credits for the project in Google AI Studio (Billing); reads resume when they are credited",
		"Meanwhile, stop paid calls if you want clients to see 503 rather than 502: breakwater brake on",
	},
	KindUpstreamModel: {
		"Set ocr.model in config.toml to a model the API serves (the model may be retired), then restart",
	},
	KindUpstreamBilling: {
		"Enable billing for the project of GEMINI_API_KEY (Google AI Studio, Billing), or run the server where the API serves the project's tier",
	},
	KindUpstreamRateLimited: {
		"The project's rate or tier limit is reached: see its limits in Google AI Studio, request a higher tier, or lower [limits.user] rates",
	},
	KindDegraded: {
		"See the figures: breakwater budget (and the reads per model: breakwater usage)",
		"Go back to the primary model now: raise the soft ceiling named above in config.toml [budget] (applied when the file is saved; an explicit 0 switches it off)",
		"Or let the day (or month) end: reads return to ocr.model by themselves, with a budget_restored alert",
	},
	KindRestored: {
		"Nothing to do: reads go to ocr.model again",
	},
	KindLedgerDrift: {
		"See every day and model on the dashboard, or run breakwater reconcile --bill FILE on an export of those days",
		"A price (cause: price): check Google's price page, then set the model's prices in config.toml [ocr.price] or its [[ocr.model_overrides]] entry",
		"Token counts (cause: tokens): Google billed other counts than the upstream reported; keep the figures and report them",
	},
}

// DegradedSummary is the summary of a KindDegraded alert: ceiling is the
// soft ceiling reached, fallback the model reads now go to.
func DegradedSummary(ceiling, fallback string) string {
	return "the soft ceiling " + ceiling + " is reached: reads go to the fallback model " + fallback + " until it is raised or the period ends"
}

// RestoredSummary is the summary of a KindRestored alert.
func RestoredSummary(primary string) string {
	return "no soft ceiling is reached any more: reads go to the primary model " + primary + " again"
}

// warnActions are what to do about an early warning of a ceiling.
func warnActions(ceiling string) []string {
	return []string{
		"See the figures: breakwater budget",
		"Raise the ceiling: edit " + ceiling + " in config.toml [budget] (applied when the file is saved)",
		"Find the heaviest users: breakwater usage",
		"Stop paid calls now: breakwater brake on (breakwater brake off releases it)",
	}
}

// actionsOf is what to do about an alert of kind.
func actionsOf(kind string) []string {
	if rest, ok := strings.CutPrefix(kind, warnPrefix); ok {
		for _, c := range warnCeilings {
			if strings.HasPrefix(rest, c+"_") {
				return warnActions(c)
			}
		}
	}
	return actions[kind]
}

// upstreamSummaries are the summaries of the alerts about the upstream's
// own refusals.
var upstreamSummaries = map[string]string{
	KindUpstreamKeyRefused:  "Gemini refused GEMINI_API_KEY: every read fails (502) until the key is fixed",
	KindUpstreamSpendCap:    "Gemini refused calls: the project's spend cap is reached; every read fails (502) until it is raised",
	KindUpstreamCredits:     "Gemini refused calls: the project's prepaid credits are used up; every read fails (502) until more are bought",
	KindUpstreamModel:       "Gemini does not serve ocr.model (not found or retired): every read fails (502) until it is changed",
	KindUpstreamBilling:     "Gemini refused calls: the project's billing is off or not set up; every read fails (502) until it is",
	KindUpstreamRateLimited: "Gemini refused calls in a row for its rate or tier limit (429 RESOURCE_EXHAUSTED): reads fail (502) while it lasts",
}

// UpstreamSummary is the summary of the alert of kind about an upstream
// refusal ("" for another kind).
func UpstreamSummary(kind string) string { return upstreamSummaries[kind] }
