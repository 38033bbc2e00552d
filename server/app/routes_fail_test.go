package app

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const referralRoute = `
[[routes]]
name = "referral"
methods = ["POST"]
path = "/api/referral/check"
upstream = "UPSTREAM"
identity = "ip"
rate = 0
burst = 0

[routes.fail]
statuses = [404]
by = ["ip", "json:email"]
limit = 5
window = "10m"
cooldown = "10m"
UNIFORM
`

// referralApp answers the referral check with 200 for the code "RIGHT"
// and 404 otherwise, with headers and a body of its own, and anything
// else with 201.
func referralApp(t *testing.T) *testApp {
	up := newTestApp(t)
	up.set(func(w http.ResponseWriter, r *http.Request, body string) {
		if r.URL.Path != "/api/referral/check" {
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("hello from the app"))
			return
		}
		var req struct{ Code string }
		_ = json.Unmarshal([]byte(body), &req)
		w.Header().Set("Set-Cookie", "app=1")
		if req.Code == "RIGHT" {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"ok":true}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"no such code"}`))
	})
	return up
}

func referral(code, email string) string {
	b, _ := json.Marshal(map[string]string{"code": code, "email": email})
	return string(b)
}

// face is an answer as a client can compare it: status, headers but Date
// and X-Request-ID, and body.
func face(resp *http.Response, body string) string {
	h := resp.Header.Clone()
	h.Del("Date")
	h.Del("X-Request-Id")
	var keys []string
	for k, v := range h {
		keys = append(keys, k+": "+strings.Join(v, ","))
	}
	slices.Sort(keys)
	return resp.Status + "\n" + strings.Join(keys, "\n") + "\n\n" + body
}

// Five failures start a cooldown: the sixth request, the right code
// included, never reaches the app; the cooldown survives a restart; and
// with both keys in `by`, the IP and the e-mail count apart.
func TestRouteFailLimit(t *testing.T) {
	up := referralApp(t)
	e := startRoutes(t, up.URL, strings.Replace(referralRoute, "UNIFORM", "", 1))
	from := func(ip string) http.Header { return hdr("X-Forwarded-For", ip, "Content-Type", "application/json") }

	for i := range 5 {
		resp, body := e.do("POST", "/api/referral/check", referral("WRONG", "x@example.com"), from("198.51.100.1"), "")
		if resp.StatusCode != http.StatusNotFound || body != `{"error":"no such code"}` {
			t.Fatalf("failure %d: %d %s, want the app's own 404", i, resp.StatusCode, body)
		}
	}
	resp, body := e.do("POST", "/api/referral/check", referral("RIGHT", "other@example.com"), from("198.51.100.1"), "")
	if resp.StatusCode != http.StatusTooManyRequests || problemCode(t, body) != "too_many_failures" || resp.Header.Get("Retry-After") != "600" {
		t.Fatalf("the right code during the IP's cooldown: %d %s Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	// The e-mail cools down too: from another IP it is refused, and
	// another e-mail from that IP is not.
	if resp, _ = e.do("POST", "/api/referral/check", referral("RIGHT", " X@Example.com "), from("198.51.100.2"), ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the cooled-down e-mail (differently written) from another IP: %d, want 429", resp.StatusCode)
	}
	if resp, _ = e.do("POST", "/api/referral/check", referral("RIGHT", "y@example.com"), from("198.51.100.2"), ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("another e-mail from another IP: %d, want 200", resp.StatusCode)
	}
	if n := len(up.requests()); n != 6 {
		t.Fatalf("the app got %d requests, want the 5 failures and the 1 allowed", n)
	}

	// Three failures with one e-mail and two with another from one IP
	// cool the IP down, and neither e-mail.
	ip := from("198.51.100.3")
	for i, email := range []string{"a@example.com", "a@example.com", "a@example.com", "b@example.com", "b@example.com"} {
		if resp, _ = e.do("POST", "/api/referral/check", referral("WRONG", email), ip, ""); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("failure %d: %d", i, resp.StatusCode)
		}
	}
	if resp, _ = e.do("POST", "/api/referral/check", referral("RIGHT", "c@example.com"), ip, ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the IP after five failures over two e-mails: %d, want 429", resp.StatusCode)
	}
	if resp, _ = e.do("POST", "/api/referral/check", referral("WRONG", "a@example.com"), from("198.51.100.4"), ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an e-mail with three failures from a fresh IP: %d, want it to reach the app", resp.StatusCode)
	}

	if m := e.metric(`breakwater_route_failures_total{reason="404",route="referral"}`); !strings.HasSuffix(m, " 11") {
		t.Errorf("counted failures metric: %q, want 11", m)
	}

	// A restart keeps the cooldown; its end lifts it.
	e.restart()
	before := len(up.requests())
	if resp, _ = e.do("POST", "/api/referral/check", referral("RIGHT", "z@example.com"), from("198.51.100.1"), ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after a restart: %d, want the cooldown kept", resp.StatusCode)
	}
	if n := len(up.requests()); n != before {
		t.Fatalf("the app got a request during the cooldown after a restart")
	}
	e.clock.advance(10*time.Minute + time.Second)
	if resp, _ = e.do("POST", "/api/referral/check", referral("RIGHT", "z@example.com"), from("198.51.100.1"), ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the cooldown: %d, want 200", resp.StatusCode)
	}
}

// With uniform_status, the app's counted failures and Breakwater's
// cooldown refusals look the same from outside, byte for byte apart from
// Date and X-Request-ID, and carry no Retry-After.
func TestRouteFailUniform(t *testing.T) {
	up := referralApp(t)
	e := startRoutes(t, up.URL, strings.Replace(referralRoute, "UNIFORM", "uniform_status = 403", 1))
	ip := hdr("X-Forwarded-For", "198.51.100.9")
	var faces []string
	for range 7 {
		resp, body := e.do("POST", "/api/referral/check", referral("WRONG", "u@example.com"), ip, "")
		faces = append(faces, face(resp, body))
	}
	resp, body := e.do("POST", "/api/referral/check", referral("RIGHT", "u@example.com"), ip, "")
	faces = append(faces, face(resp, body))
	if n := len(up.requests()); n != 5 {
		t.Fatalf("the app got %d requests, want 5", n)
	}
	for i, f := range faces {
		if f != faces[0] {
			t.Errorf("answer %d differs from the first:\n%s\n---\n%s", i, f, faces[0])
		}
	}
	if !strings.HasPrefix(faces[0], "403 Forbidden\n") || strings.Contains(faces[0], "Retry-After") || strings.Contains(faces[0], "Set-Cookie") {
		t.Errorf("the uniform answer: %s", faces[0])
	}
	// The precise reasons go to the metric.
	if m := e.metric(`breakwater_route_failures_total{reason="cooldown",route="referral"}`); !strings.HasSuffix(m, " 3") {
		t.Errorf("cooldown refusals metric: %q, want 3", m)
	}
}

// Fifty failures at once are judged at most `limit` times: checking and
// counting are one step per key.
func TestRouteFailParallel(t *testing.T) {
	up := referralApp(t)
	release := make(chan struct{})
	inner := up.respond.Load()
	up.set(func(w http.ResponseWriter, r *http.Request, body string) {
		<-release
		(*inner)(w, r, body)
	})
	e := startRoutes(t, up.URL, strings.Replace(referralRoute, "UNIFORM", "", 1))
	var wg sync.WaitGroup
	codes := make(chan int, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := e.do("POST", "/api/referral/check", referral("WRONG", "p@example.com"), hdr("X-Forwarded-For", "198.51.100.20"), "")
			codes <- resp.StatusCode
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(codes) < 45 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the 45 refused answer at once
	}
	close(release)
	wg.Wait()
	close(codes)
	n := len(up.requests())
	if n < 1 || n > 5 {
		t.Fatalf("the app got %d of 50 parallel requests, want 1 to 5", n)
	}
	refused := 0
	for c := range codes {
		if c == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 50-n {
		t.Errorf("%d refused, want %d", refused, 50-n)
	}
}
