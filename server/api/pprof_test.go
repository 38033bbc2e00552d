package api

import (
	"net/http"
	"testing"

	"breakwater/server/edge"
)

// TestNoPprofOnPublic: with server.admin_pprof on, Go's profiler is on
// the admin listener (server/admin's TestAdminPprof), never on the public
// one.
func TestNoPprofOnPublic(t *testing.T) {
	on := newEnv(t, envOptions{cfg: func(c *edge.Config) { c.AdminPprof = true }})
	url := on.http.URL + "/debug/pprof/"
	resp, _ := do(t, mustRequest(t, http.MethodGet, url, testAdminToken))
	if got, want := resp.StatusCode, http.StatusNotFound; got != want {
		t.Errorf("GET %s: %d, want %d", url, got, want)
	}
}
