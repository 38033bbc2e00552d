package admin

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestChartScales(t *testing.T) {
	for _, c := range []struct{ n, even, nice int64 }{
		{0, 2, 1}, {1, 2, 1}, {3, 4, 5}, {4, 4, 5}, {5, 10, 5}, {11, 20, 20}, {600, 1000, 1000}, {150, 200, 200},
	} {
		if got := evenCeil(c.n); got != c.even {
			t.Errorf("evenCeil(%d) = %d, want %d", c.n, got, c.even)
		}
		if got := niceCeil(c.n); got != c.nice {
			t.Errorf("niceCeil(%d) = %d, want %d", c.n, got, c.nice)
		}
	}
}

// formTokenIn reads the brake form's token off the dashboard.
func formTokenIn(t *testing.T, e *testAdmin) string {
	t.Helper()
	resp, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %d", resp.StatusCode)
	}
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no form token in the dashboard:\n%s", body)
	}
	return string(m[1])
}

// TestDashboardBrakeButton: the dashboard's brake form engages and
// releases the manual brake only with the admin token, the page's form
// token and no foreign origin.
func TestDashboardBrakeButton(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	token := formTokenIn(t, e)
	post := func(admin string, form url.Values, headers ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, e.admin.URL+"/brake", strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if admin != "" {
			req.SetBasicAuth("admin", admin)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		name    string
		admin   string
		form    url.Values
		headers []string
		status  int
	}{
		{"no form token", testAdminToken, url.Values{"on": {"true"}}, nil, http.StatusForbidden},
		{"wrong form token", testAdminToken, url.Values{"on": {"true"}, "csrf": {strings.Repeat("0", 64)}}, nil, http.StatusForbidden},
		{"another origin", testAdminToken, url.Values{"on": {"true"}, "csrf": {token}}, []string{"Origin", "http://evil.example"}, http.StatusForbidden},
		{"cross-site fetch", testAdminToken, url.Values{"on": {"true"}, "csrf": {token}}, []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"no admin token", "", url.Values{"on": {"true"}, "csrf": {token}}, nil, http.StatusUnauthorized},
		{"wrong admin token", "wrong", url.Values{"on": {"true"}, "csrf": {token}}, nil, http.StatusUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			if resp := post(c.admin, c.form, c.headers...); resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
			if st := e.brake.Status(time.Now()); st.Manual || st.Engaged {
				t.Errorf("the brake moved: %+v", st)
			}
		})
	}
	origin := []string{"Origin", e.admin.URL, "Sec-Fetch-Site", "same-origin"}
	resp := post(testAdminToken, url.Values{"on": {"true"}, "csrf": {token}}, origin...)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("with the form token: %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	if st := e.brake.Status(time.Now()); !st.Manual || !st.Engaged {
		t.Fatalf("the brake is not engaged: %+v", st)
	}
	_, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken))
	if !strings.Contains(string(body), "Release the manual brake") {
		t.Error("the dashboard does not offer to release the brake")
	}
	if resp := post(testAdminToken, url.Values{"on": {"false"}, "csrf": {token}}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("release: %d", resp.StatusCode)
	}
	if st := e.brake.Status(time.Now()); st.Manual {
		t.Errorf("the brake is still on: %+v", st)
	}
}

func TestDashboardNeedsToken(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	resp, _ := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", ""))
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("no token: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req := mustRequest(t, http.MethodGet, e.admin.URL+"/", "")
	req.SetBasicAuth("admin", "wrong")
	if resp, _ := do(t, req); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong password: %d", resp.StatusCode)
	}
	req.SetBasicAuth("admin", testAdminToken)
	resp, body := do(t, req)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<svg") {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}
