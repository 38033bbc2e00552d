package api

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"breakwater/server/invites"
)

// shadowRefusals reads breakwater_shadow_refusals_total{layer,reason}.
func (e *env) shadowRefusals(layer, reason string) int {
	e.t.Helper()
	var m dto.Metric
	if err := e.metrics.shadowRefusals.WithLabelValues(layer, reason).Write(&m); err != nil {
		e.t.Fatal(err)
	}
	return int(m.GetCounter().GetValue())
}

// In shadow mode the invite protections refuse nothing: a wrong code
// past the fail limit is still answered as wrong (not as a cooldown), the
// right code passes, and the would-be refusals are counted; no cooldown
// starts that enforcing would not start. Back to enforce, the refusals
// come at once.
func TestVerifyInviteShadow(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{FailLimit: 2, Mode: "shadow"})})
	code, _ := e.newInvite(5, 0)
	var refused refusedBody
	for range 2 {
		refused.wantVerify(t, e, "WRONG-CODE-XX", "eve@example.com")
	}
	// Enforcing, the e-mail and the IP would now be cooling down.
	for range 3 {
		refused.wantVerify(t, e, "WRONG-CODE-XX", "eve@example.com")
	}
	if got := e.inviteRefusals("cooldown"); got != 0 {
		t.Errorf("cooldown refusals = %d, want 0 in shadow mode", got)
	}
	if got := e.inviteRefusals("invalid"); got != 5 {
		t.Errorf("invalid = %d, want 5: every check was evaluated", got)
	}
	if got := e.shadowRefusals(invites.Layer, "cooldown"); got != 3 {
		t.Errorf("shadow cooldown refusals = %d, want 3", got)
	}
	wantValid(t, e, code, "eve@example.com")
	if got := e.shadowRefusals(invites.Layer, "cooldown"); got != 4 {
		t.Errorf("shadow cooldown refusals = %d, want 4", got)
	}

	e.srv.inviteLimits.SetShadow(false)
	resp, data := e.verify(code, "eve@example.com")
	refused.want(t, resp, data)
	if resp.StatusCode != http.StatusForbidden || e.inviteRefusals("cooldown") != 1 {
		t.Errorf("enforcing: %d, cooldown refusals %d; want the cooldown", resp.StatusCode, e.inviteRefusals("cooldown"))
	}
}
