package app

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"breakwater/server/guard/replay"
)

// A window of an hour with no burst: whether a request is refused does
// not depend on where in its minute a replay puts a counted refusal.
const replayRoutes = `
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
identity = "user"
rate = 3
window = "1h"
burst = 0

[[routes]]
name = "signup"
path = "/signup"
identity = "ip"
rate = 2
window = "1h"
`

// A database filled through real forward-auth checks (the README's Caddy
// snippet in front): breakwater replay over it, with the config in
// force, refuses on route:checkout and route:signup exactly what
// /metrics counted, and sees every request that reached the layer. On
// the old code forward-auth checks were not recorded and the replay saw
// 0 requests.
func TestReplayForwardAuthRoutes(t *testing.T) {
	app := newLenientApp(t)
	e := startRoutes(t, "", replayRoutes)
	addr := startRealProxy(t, "caddy", e, app.URL)

	sent := map[string]int{}
	for u := range 3 {
		h := hdr("Authorization", "Bearer "+e.key(fmt.Sprintf("buyer%d", u)), "Content-Type", "application/json")
		for i := range 4 + 2*u {
			path := "/api/checkout"
			if i%2 == 1 {
				path = "/API/Checkout/" // a spelling is the route too
			}
			rawRequest(t, addr, "127.0.0.1", http.MethodPost, path, h, "{}")
			sent["checkout"]++
		}
		e.clock.advance(time.Second)
	}
	for c := range 2 {
		for range 5 {
			rawRequest(t, addr, fmt.Sprintf("127.0.0.%d", 20+c), http.MethodGet, "/signup", nil, "")
			sent["signup"]++
		}
	}
	rawRequest(t, addr, "127.0.0.1", http.MethodGet, "/elsewhere", nil, "") // no route: no event

	refused := map[string]int64{}
	for _, name := range []string{"checkout", "signup"} {
		for _, l := range strings.Split(e.metric(`breakwater_refusals_total{layer="route:`+name+`"`), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			refused[name] += int64(n)
		}
	}
	if refused["checkout"] != 1+3+5 || refused["signup"] != 3+3 {
		t.Fatalf("/metrics counted %v refusals, want checkout 9 (3 users, 3 an hour each) and signup 6", refused)
	}

	e.close() // the recorder's last rows and tallies are written
	cfg := e.cfg
	rec, closeDB, err := OpenRecorded(cfg, Options{Getenv: env(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	day := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	got, err := rec.Recorded(context.Background(), day, day.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replay.Run(got.Events, cfg.ReplayLimits(), cfg.ReplayLimits(), "2026-03-10", "2026-03-10", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkout", "signup"} {
		var layer *replay.LayerReport
		for i := range rep.Layers {
			if rep.Layers[i].Layer == replay.RouteLayer(name) {
				layer = &rep.Layers[i]
			}
		}
		if layer == nil {
			t.Fatalf("the replay has no layer route:%s: %+v", name, rep.Layers)
		}
		if layer.Current.Refused != refused[name] || layer.Current.Requests != int64(sent[name]) {
			t.Errorf("replay of route:%s: %d requests, %d refused; /metrics counted %d refused of %d sent",
				name, layer.Current.Requests, layer.Current.Refused, refused[name], sent[name])
		}
	}
}
