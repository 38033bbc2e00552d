package app

import (
	"net/http"
	"strings"
	"testing"

	"breakwater/server/routes"
)

// The README's [[routes]] example loads.
func TestReadmeRoutesLoad(t *testing.T) {
	path := writeConfig(t, minimal+snippet(t, "routes-config"))
	c, err := Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 3 {
		t.Errorf("%d routes, want 3", len(c.Routes))
	}
}

// Shadow mode lets would-be refusals through, counts them, and keeps the
// windows advancing; a reload applies a route's limits live and names a
// new route as needing a restart.
func TestRouteShadowAndReload(t *testing.T) {
	up := newTestApp(t)
	e := startRoutes(t, up.URL, strings.Replace(contactRoute, "burst = 0", "burst = 0\nmode = \"shadow\"", 1))
	for i := range 4 {
		if resp, _ := e.do("POST", "/contact", "hi", nil, ""); resp.StatusCode != http.StatusCreated {
			t.Fatalf("shadow request %d: %d, want it let through", i, resp.StatusCode)
		}
	}
	if m := e.metric(`breakwater_shadow_refusals_total{layer="route:contact",reason="rate"}`); !strings.HasSuffix(m, " 2") {
		t.Errorf("shadow refusals: %q, want 2", m)
	}
	if m := e.metric(`breakwater_refusals_total{layer="route:contact"`); m != "" {
		t.Errorf("shadow refusals counted as refusals: %q", m)
	}
	if !strings.Contains(e.logText(), "shadow mode: a refusal let through") {
		t.Error("the shadow refusal is not logged")
	}

	next := e.cfg
	next.Routes = append([]routes.Config(nil), e.cfg.Routes...)
	next.Routes[0].Mode = "enforce"
	next.Routes[0].Rate = 5
	added := next.Routes[0]
	added.Name, added.Path = "added", "/added"
	next.Routes = append(next.Routes, added)
	if got := NeedsRestart(e.cfg, next); len(got) != 1 || got[0] != "routes.added (new)" {
		t.Errorf("NeedsRestart = %q, want only the new route", got)
	}
	e.app.Reload(next, "test")
	// Rate 5 now, enforced: the window holds the 2 it admitted (a
	// refusal takes no slot, in shadow mode as when enforcing).
	for i := range 3 {
		if resp, _ := e.do("POST", "/contact", "hi", nil, ""); resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d with rate 5: %d", i, resp.StatusCode)
		}
	}
	if resp, _ := e.do("POST", "/contact", "hi", nil, ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("sixth with rate 5, enforcing: %d, want 429", resp.StatusCode)
	}
	if resp, _ := e.do("POST", "/added", "hi", nil, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a route added by reload: %d, want 404 until a restart", resp.StatusCode)
	}
	if !strings.Contains(e.logText(), "routes.added (new)") {
		t.Error("the log does not say the new route needs a restart")
	}
}
