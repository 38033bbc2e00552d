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
		{"overlaps /v1/ in another spelling", []Config{{Name: "a", Path: "/V1//ocr/", Identity: IdentityIP, CaseSensitive: true}}, "overlaps /v1"},
		{"covers /healthz", []Config{{Name: "a", Path: "/Healthz/*", Identity: IdentityIP}}, "overlaps /healthz"},
		{"a parameter never matches", []Config{{Name: "a", Path: "/a;b", Identity: IdentityIP}}, `routes "a": path`},
		{"bad escape", []Config{{Name: "a", Path: "/a%zz", Identity: IdentityIP}}, `routes "a": path`},
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
		{Name: "contact", Path: "/contact/", Identity: IdentityIP, Methods: []string{"post"}},
		{Name: "page", Path: "/page", Identity: IdentityIP, Methods: []string{"GET"}},
		{Name: "Exact", Path: "/Exact/Case", Identity: IdentityIP, CaseSensitive: true},
		{Name: "report", Path: "/report.v2", Identity: IdentityIP},
		{Name: "item", Path: "/items/7", Identity: IdentityIP, Methods: []string{"DELETE"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ method, path, want string }{
		{"POST", "/api/billing/portal", "portal"}, // exact beats prefix
		{"GET", "/api/billing/portal", "billing"}, // the exact one does not take GET
		{"GET", "/api/billing/invoices/7", "billing"},
		{"GET", "/api/billing", "billing"}, // a prefix matches itself without its slash
		{"GET", "/api/billingx", "api"},    // but not a longer segment
		{"GET", "/api/other", "api"},       // the longest prefix
		{"POST", "/contact", "contact"},    // a route's trailing slash is no part of its path
		{"post", "/contact", "contact"},    // methods are upper-cased on both sides
		{"GET", "/contact", ""},            // GET is not one of contact's methods
		{"HEAD", "/page", "page"},          // a framework answers HEAD with the GET handler
		{"HEAD", "/contact", ""},
		{"GET", "/elsewhere", ""},
		// Case is ignored unless the route says case_sensitive.
		{"POST", "/API/Billing/Portal", "portal"},
		{"POST", "/CONTACT", "contact"},
		{"GET", "/Exact/Case", "Exact"},
		{"GET", "/exact/case", ""},
		// Every spelling Normalize folds.
		{"POST", "/contact/", "contact"},
		{"POST", "/contact;jsessionid=1", "contact"},
		{"POST", "//contact", "contact"},
		{"POST", "/x/../contact", "contact"},
		{"POST", "/%63ontact", "contact"},
		{"POST", "/api%2Fbilling%2Fportal", "portal"},
		{"POST", `/api\billing%5Cportal`, "portal"},
		{"POST", "/contact.", "contact"},
		{"POST", "/contact%20", "contact"},
		{"POST", "/contact%20./", "contact"},
		// A format suffix (Rails, Spring), unless a route has the path
		// as it is.
		{"POST", "/contact.json", "contact"},
		{"POST", "/CONTACT.json", "contact"},
		{"POST", "/contact.tar.gz", "contact"},
		{"GET", "/api/billing.json", "billing"},
		{"GET", "/Exact/Case.json", "Exact"},
		{"GET", "/exact/case.json", ""},
		{"POST", "/contact.d/x", ""},
		{"POST", "/contactx.json", ""},
		{"GET", "/report.v2.pdf", "report"},
		{"GET", "/report.v2", "report"},
		{"GET", "/report.json", ""},
		// A POST may be made any method by the framework (_method,
		// X-HTTP-Method-Override): it is the route of its path.
		{"POST", "/page", "page"},
		{"POST", "/items/7", "item"},
		{"POST", "/items/7.json", "item"},
		{"DELETE", "/items/7", "item"},
		{"PUT", "/items/7", ""},
		{"PUT", "/page", ""},
	} {
		p, err := Normalize(tt.path)
		if err != nil {
			t.Fatalf("Normalize(%q): %v", tt.path, err)
		}
		got := ""
		if r := table.Match(tt.method, p); r != nil {
			got = r.Name
		}
		if got != tt.want {
			t.Errorf("Match(%s %s) = %q, want %q", tt.method, tt.path, got, tt.want)
		}
	}
	if r := table.Named("portal"); r == nil || r.Path != "/api/billing/portal" || r.MaxBody != DefaultMaxBody || r.Mode != ModeEnforce {
		t.Errorf("Named(portal) = %+v", r)
	}
	if r := table.Named("billing"); r == nil || r.Path != "/api/billing/*" {
		t.Errorf("Named(billing) = %+v, want its path as written", r)
	}
	if r := table.MatchPath("/contact"); r == nil || r.Name != "contact" {
		t.Errorf("MatchPath(/contact) = %+v, want contact whatever the method", r)
	}
}

func TestNormalize(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/", "/"},
		{"/api/checkout", "/api/checkout"},
		{"/API/Checkout", "/API/Checkout"}, // case is the table's business
		{"/api/checkout/", "/api/checkout"},
		{"/api/checkout;x=1", "/api/checkout"},
		{"/api;v=2/checkout;x=1/", "/api/checkout"},
		{"//api//checkout", "/api/checkout"},
		{"/api/./checkout", "/api/checkout"},
		{"/api/x/../checkout", "/api/checkout"},
		{"/../../api/checkout", "/api/checkout"},
		{"/api/%63heckout", "/api/checkout"},
		{"/api%2Fcheckout", "/api/checkout"},        // an escaped slash separates
		{"/api/x/%2e%2E/checkout", "/api/checkout"}, // escaped dots are dots
		{"/api/x/..;/checkout", "/api/checkout"},    // a parameter hides no dot segment
		{"/api/checkout%3Bx", "/api/checkout"},      // nor an escaped one
		{"/a%2520b", "/a%20b"},                      // decoded once
		{"/a b", "/a b"},
		{"/.", "/"},
		{"/;x", "/"},
		{`/api\checkout`, "/api/checkout"}, // a backslash is a slash
		{"/api%5Ccheckout", "/api/checkout"},
		{`/api\x\..\checkout`, "/api/checkout"},
		{"/api/checkout.", "/api/checkout"}, // dots at a segment's end go
		{"/api/checkout..", "/api/checkout"},
		{"/api./checkout", "/api/checkout"},
		{"/api/checkout%20", "/api/checkout"}, // spaces around a segment go
		{"/api/%20checkout", "/api/checkout"},
		{"/api/checkout%20.%20/", "/api/checkout"},
		{"/api/x/..%20/checkout", "/api/checkout"}, // and then a dot segment is one
		{"/api/.../checkout", "/api/checkout"},
		{"/api/check.out", "/api/check.out"},
		{"/api/checkout.json", "/api/checkout.json"}, // a format suffix is the table's business
	} {
		got, err := Normalize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "api/checkout", "/a%zz", "/a%", "/a%00b", "/a\x7fb", "/a%0Ab"} {
		if got, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) = %q, want ErrBadPath", bad, got)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"/api/checkout?x=1", "/api/checkout"},
		{"/api/checkout/?next=/a/../b", "/api/checkout"},
		{"/api/checkout?x#frag", "/api/checkout"}, // a '#' of the query is the query's
	} {
		if got, err := URIPath(tt.in); err != nil || got != tt.want {
			t.Errorf("URIPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	// A '#' in the path: nginx forwards it as it came, and apps read it
	// as a fragment's start or as a letter.
	for _, bad := range []string{"http://evil/api/checkout", "*", "?x=1", "/api/checkout#frag", `/api\checkout#x`, "/page#/../api/checkout"} {
		if got, err := URIPath(bad); err == nil {
			t.Errorf("URIPath(%q) = %q, want ErrBadPath", bad, got)
		}
	}
}

// FuzzNormalize checks that a normalized path is a fixed point: matching
// it again gives the same route.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"/api/checkout", "//a/./b/../c;x/", "/%2e%2e/%2F", "/a%zz", "/..;/x", `/a\b. /c%20`, "/.. /x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := Normalize(in)
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || (p != "/" && strings.HasSuffix(p, "/")) || strings.Contains(p, "//") {
			t.Fatalf("Normalize(%q) = %q, not a normal path", in, p)
		}
		if strings.ContainsAny(p, ";\\") {
			t.Fatalf("Normalize(%q) = %q keeps a parameter or a backslash", in, p)
		}
		for seg := range strings.SplitSeq(p, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Normalize(%q) = %q keeps a dot segment", in, p)
			}
			if seg != "" && (strings.Trim(seg, " ") != seg || strings.HasSuffix(seg, ".")) {
				t.Fatalf("Normalize(%q) = %q keeps a space around a segment or a dot at its end", in, p)
			}
		}
		if !strings.Contains(p, "%") {
			if again, err := Normalize(p); err != nil || again != p {
				t.Fatalf("Normalize(Normalize(%q)) = %q, %v; want %q", in, again, err, p)
			}
		}
	})
}
