package routes

import (
	"strings"
	"testing"
)

func TestValidateNamesTheRouteAndKey(t *testing.T) {
	ok := Config{Name: "checkout", Path: "/api/checkout", Identity: IdentityUser, Rate: 10}
	for _, tt := range []struct {
		name   string
		routes []Config
		want   string // "" for valid
	}{
		{"valid", []Config{ok, {Name: "contact", Path: "/contact", Identity: IdentityIP, Methods: []string{"post"}}}, ""},
		{"prefix", []Config{{Name: "billing", Path: "/api/billing/*", Identity: IdentityUser}}, ""},
		{"bad name", []Config{{Name: "check out", Path: "/x", Identity: IdentityIP}}, `routes "check out": name`},
		{"two names", []Config{ok, ok}, `routes "checkout": name: two routes are named "checkout"`},
		{"identity", []Config{{Name: "a", Path: "/a", Identity: "anyone"}}, `routes "a": identity`},
		{"no identity", []Config{{Name: "a", Path: "/a"}}, `routes "a": identity`},
		{"overlaps /v1/", []Config{{Name: "a", Path: "/v1/ocr", Identity: IdentityIP}}, "overlaps /v1"},
		{"covers /v1/", []Config{{Name: "a", Path: "/*", Identity: IdentityIP}}, "overlaps /v1"},
		{"overlaps /healthz", []Config{{Name: "a", Path: "/healthz", Identity: IdentityIP}}, "overlaps /healthz"},
		{"wildcard inside", []Config{{Name: "a", Path: "/a/*/b", Identity: IdentityIP}}, `routes "a": path`},
		{"relative path", []Config{{Name: "a", Path: "a", Identity: IdentityIP}}, `routes "a": path`},
		{"method", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Methods: []string{"FETCH"}}}, `routes "a": methods`},
		{"upstream", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Upstream: "127.0.0.1:3000"}}, `routes "a": upstream`},
		{"fail without upstream", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Fail: &FailConfig{}}}, `routes "a": fail: a fail limit is judged`},
		{"fail by", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Upstream: "http://x", Fail: &FailConfig{By: []string{"json:"}}}}, `by: "json:"`},
		{"uniform status", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Upstream: "http://x", Fail: &FailConfig{UniformStatus: 200}}}, "uniform_status"},
		{"mode", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Mode: "dry"}}, `routes "a": mode`},
		{"rate", []Config{{Name: "a", Path: "/a", Identity: IdentityIP, Rate: -1}}, `routes "a": rate`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.routes)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate: %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	table, err := NewTable([]Config{
		{Name: "billing", Path: "/api/billing/*", Identity: IdentityUser},
		{Name: "portal", Path: "/api/billing/portal", Identity: IdentityUser, Methods: []string{"POST"}},
		{Name: "api", Path: "/api/*", Identity: IdentityIP},
		{Name: "contact", Path: "/contact", Identity: IdentityIP, Methods: []string{"post"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ method, path, want string }{
		{"POST", "/api/billing/portal", "portal"}, // exact beats prefix
		{"GET", "/api/billing/portal", "billing"}, // the exact one does not take GET
		{"GET", "/api/billing/invoices/7", "billing"},
		{"GET", "/api/other", "api"}, // the longest prefix
		{"POST", "/contact", "contact"},
		{"GET", "/contact", ""}, // methods are upper-cased, and GET is not one
		{"POST", "/contact/", ""},
		{"GET", "/elsewhere", ""},
	} {
		got := ""
		if r := table.Match(tt.method, tt.path); r != nil {
			got = r.Name
		}
		if got != tt.want {
			t.Errorf("Match(%s %s) = %q, want %q", tt.method, tt.path, got, tt.want)
		}
	}
	if r := table.Named("portal"); r == nil || r.Path != "/api/billing/portal" || r.MaxBody != DefaultMaxBody || r.Mode != ModeEnforce {
		t.Errorf("Named(portal) = %+v", r)
	}
}
