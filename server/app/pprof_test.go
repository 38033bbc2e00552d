package app

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// server.admin_pprof is a key of [server]: off when left out, read from
// the file and from the environment, and a misspelling is refused like
// any unknown key.
func TestAdminPprofKey(t *testing.T) {
	for _, tt := range []struct {
		name string
		body string
		vars map[string]string
		want bool
	}{
		{"left out", minimal, nil, false},
		{"in the file", "[server]\nadmin_pprof = true\n" + minimal, nil, true},
		{"from the environment", minimal, map[string]string{"BREAKWATER_SERVER__ADMIN_PPROF": "true"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeConfig(t, tt.body), env(tt.vars))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Server.AdminPprof; got != tt.want {
				t.Errorf("server.admin_pprof = %v, want %v", got, tt.want)
			}
		})
	}
	_, err := Load(writeConfig(t, "[server]\nadmin_prof = true\n"+minimal), env(nil))
	if err == nil || !strings.Contains(err.Error(), "server.admin_prof") {
		t.Errorf("a misspelt key: %v, want an error naming server.admin_prof", err)
	}
}

// A reload does not switch the profiler: it needs a restart, and says so.
func TestAdminPprofNeedsARestart(t *testing.T) {
	e := startRoutes(t, "", "")
	index := func() int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+e.app.AdminAddr()+"/debug/pprof/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e.admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := index(); got != http.StatusNotFound {
		t.Fatalf("off: /debug/pprof/ answered %d, want 404", got)
	}

	next := e.cfg
	next.Server.AdminPprof = true
	if got := NeedsRestart(e.cfg, next); !slices.Equal(got, []string{"server.admin_pprof"}) {
		t.Errorf("NeedsRestart = %q, want only server.admin_pprof", got)
	}
	e.app.Reload(next, "test")
	if got := index(); got != http.StatusNotFound {
		t.Errorf("after a reload that turns it on: %d, want 404 until a restart", got)
	}
	if log := e.logText(); !strings.Contains(log, "needs a restart") || !strings.Contains(log, "key=server.admin_pprof") {
		t.Errorf("the log does not say server.admin_pprof needs a restart:\n%s", log)
	}

	e.cfg = next
	e.restart()
	if got := index(); got != http.StatusOK {
		t.Errorf("on after a restart: %d, want 200", got)
	}
}
