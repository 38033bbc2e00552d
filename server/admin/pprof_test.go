package admin

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"breakwater/server/edge"
)

// Go's profiler is on the admin listener only with server.admin_pprof,
// and then only with the admin token (server/api's TestNoPprofOnPublic:
// it never appears on the public listener).
func TestAdminPprof(t *testing.T) {
	off := newTestAdmin(t, adminOptions{})
	on := newTestAdmin(t, adminOptions{cfg: func(c *edge.Config) { c.AdminPprof = true }})

	for _, tt := range []struct {
		name   string
		url    string
		token  string
		status int
	}{
		{"off, with the token", off.admin.URL + "/debug/pprof/", testAdminToken, http.StatusNotFound},
		{"off, a named profile with the token", off.admin.URL + "/debug/pprof/heap", testAdminToken, http.StatusNotFound},
		{"on, no token", on.admin.URL + "/debug/pprof/", "", http.StatusUnauthorized},
		{"on, a wrong token", on.admin.URL + "/debug/pprof/heap", "wrong", http.StatusUnauthorized},
		{"on, the CPU profile without the token", on.admin.URL + "/debug/pprof/profile?seconds=1", "", http.StatusUnauthorized},
		{"on, the index", on.admin.URL + "/debug/pprof/", testAdminToken, http.StatusOK},
		{"on, cmdline", on.admin.URL + "/debug/pprof/cmdline", testAdminToken, http.StatusOK},
		{"on, symbol", on.admin.URL + "/debug/pprof/symbol", testAdminToken, http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, _ := do(t, mustRequest(t, http.MethodGet, tt.url, tt.token))
			if got, want := resp.StatusCode, tt.status; got != want {
				t.Errorf("GET %s: %d, want %d", tt.url, got, want)
			}
		})
	}

	t.Run("on, the index lists the named profiles", func(t *testing.T) {
		_, body := do(t, mustRequest(t, http.MethodGet, on.admin.URL+"/debug/pprof/", testAdminToken))
		for _, name := range pprofProfiles {
			if !strings.Contains(string(body), name) {
				t.Errorf("the index does not list %s:\n%s", name, body)
			}
		}
	})
	for _, name := range pprofProfiles {
		t.Run("on, "+name, func(t *testing.T) {
			resp, body := do(t, mustRequest(t, http.MethodGet, on.admin.URL+"/debug/pprof/"+name, testAdminToken))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d: %s", resp.StatusCode, body)
			}
			mustProfile(t, body)
		})
	}
	t.Run("on, a CPU profile of one second", func(t *testing.T) {
		resp, body := do(t, mustRequest(t, http.MethodGet, on.admin.URL+"/debug/pprof/profile?seconds=1", testAdminToken))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d: %s", resp.StatusCode, body)
		}
		mustProfile(t, body)
	})
	t.Run("on, an execution trace", func(t *testing.T) {
		resp, body := do(t, mustRequest(t, http.MethodGet, on.admin.URL+"/debug/pprof/trace?seconds=0.1", testAdminToken))
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Fatalf("%d, %d bytes", resp.StatusCode, len(body))
		}
	})
}

// mustProfile checks that body is a profile in pprof's format: gzipped,
// and not empty inside.
func mustProfile(t *testing.T, body []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("not a gzipped profile (%d bytes): %v", len(body), err)
	}
	data, err := io.ReadAll(zr)
	if err != nil || len(data) == 0 {
		t.Fatalf("profile of %d bytes unpacks to %d bytes: %v", len(body), len(data), err)
	}
}
