package api

import (
	"net/http"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/routes"
	"breakwater/storage"
)

// BenchmarkForwardAuth is the cost of one forward-auth check through the
// real public handler, without sockets: a request of no route, which
// passes (the proxies send every request of the app to forward auth),
// as written and in a spelling that must be normalized, beside a checked
// request of a user route and of an IP route, which pass too and queue
// their statistics event. The README's routes section quotes these.
//
//	go test -run '^$' -bench ForwardAuth -benchmem ./server/api/
func BenchmarkForwardAuth(b *testing.B) {
	now := time.Now()
	route := func(c routes.Config) Route {
		w, err := limiter.New(c.Limits())
		if err != nil {
			b.Fatal(err)
		}
		return Route{Config: c, Windows: w, Attempts: budget.NewAttempts(time.UTC, budget.DayKey(now, time.UTC), nil)}
	}
	srv, secrets := newBenchServiceOn(b, limiter.Config{Rate: 1, Window: time.Hour}, storage.Options{}, func(c *edge.Config, d *Deps) {
		c.TrustedProxies = []string{"127.0.0.1"}
		d.Routes = []Route{
			route(routes.Config{Name: "checkout", Methods: []string{"POST"}, Path: "/api/checkout", Identity: routes.IdentityUser}),
			route(routes.Config{Name: "contact", Methods: []string{"POST"}, Path: "/contact", Identity: routes.IdentityIP}),
			route(routes.Config{Name: "billing", Path: "/api/billing/*", Identity: routes.IdentityUser}),
		}
	})
	h := srv.Handler()
	check := func(method, uri string, extra ...string) *http.Request {
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1/forward-auth", nil)
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("X-Forwarded-Method", method)
		req.Header.Set("X-Forwarded-Uri", uri)
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		req.Header.Set("Accept", "text/html")
		req.Header.Set("User-Agent", "Mozilla/5.0")
		for i := 0; i+1 < len(extra); i += 2 {
			req.Header.Set(extra[i], extra[i+1])
		}
		return req
	}
	for _, bc := range []struct {
		name string
		req  *http.Request
	}{
		{"no route", check("GET", "/static/app.js?v=3")},
		{"no route, spelled", check("GET", "/Static//js/./app.js;v=3/")},
		{"user route", check("POST", "/api/checkout", "Authorization", "Bearer "+secrets[0])},
		{"ip route", check("POST", "/contact")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				w.reset()
				h.ServeHTTP(w, bc.req)
				if w.status != http.StatusOK {
					b.Fatalf("status %d, want 200", w.status)
				}
			}
		})
	}
}
