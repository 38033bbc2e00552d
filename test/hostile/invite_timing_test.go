package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"breakwater/server/invites"
)

// TestInviteTimingFromOutside measures, from outside over loopback, how
// long the real binary takes to refuse a code that no invite has and one
// that exists but is refused (expired, used up, revoked), as a guesser
// would: one keep-alive connection, each request from its own address
// and e-mail (so that no fail limit holds), the two classes interleaved
// in pairs in random order after a warm-up, so that drift and the
// machine's other load fall on both. It prints the medians and the
// median of the pairs' differences with its 95% interval.
//
// Each class is three codes sent in turn, as a guesser who wants to know
// whether a code exists sends it again and again: a code sent again
// finds its records in the CPU's caches, and fresh random codes against
// three repeated existing ones would measure that (existing codes 1 to
// 5 µs sooner here), not whether the code exists; a repeated unknown code
// is as warm.
//
// Pairs are added until the interval is narrow enough to tell maxLeak
// (it lies within ±maxLeak: pass; wholly beyond it: fail), or fail after
// maxPairs: too busy a machine says so rather than passing blind.
func TestInviteTimingFromOutside(t *testing.T) {
	const (
		maxLeak  = 5 * time.Microsecond
		warmUp   = 500
		step     = 2000
		maxPairs = 40_000
	)
	e := start(t, defaults)
	existing := e.refusedInvites()
	for range 20 { // valid invites, never sent: the stand-ins of unknown codes
		e.createInvite(5, "", "valid")
	}
	unknown := []string{invites.NewCode(), invites.NewCode(), invites.NewCode()}

	c := newClient(1)
	n := 0
	verify := func(code string) float64 {
		n++ // a new address and e-mail each time: no fail limit holds
		body, _ := json.Marshal(map[string]string{"code": code, "email": fmt.Sprintf("t%d@example.com", n)})
		req, _ := http.NewRequest(http.MethodPost, "http://"+e.proc.Addr+"/v1/invites/verify", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255))
		begin := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(begin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("verify %q: status %d, want 403", code, resp.StatusCode)
		}
		return float64(took)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var unknownT, existingT, diffs []float64
	for i := 0; ; i++ {
		u, k := unknown[i%len(unknown)], existing[i%len(existing)]
		var tu, tk float64
		if rng.IntN(2) == 0 {
			tu, tk = verify(u), verify(k)
		} else {
			tk, tu = verify(k), verify(u)
		}
		if i < warmUp {
			continue
		}
		unknownT, existingT, diffs = append(unknownT, tu), append(existingT, tk), append(diffs, tk-tu)
		if len(diffs)%step != 0 {
			continue
		}
		d, lo, hi := medianInterval(diffs)
		t.Logf("%d pairs: median unknown %.1fµs, existing %.1fµs; existing - unknown, median of the pairs %+.2fµs, 95%% interval [%+.2f, %+.2f]µs",
			len(diffs), median(unknownT)/1e3, median(existingT)/1e3, d/1e3, lo/1e3, hi/1e3)
		switch leak := float64(maxLeak); {
		case lo >= -leak && hi <= leak:
			return
		case lo > leak || hi < -leak:
			t.Fatalf("an existing code is answered %+.2fµs from an unknown one (95%% interval [%+.2f, %+.2f]µs), beyond ±%v",
				d/1e3, lo/1e3, hi/1e3, maxLeak)
		case len(diffs) >= maxPairs:
			t.Fatalf("after %d pairs the 95%% interval [%+.2f, %+.2f]µs still cannot tell ±%v: the machine was too busy to measure",
				len(diffs), lo/1e3, hi/1e3, maxLeak)
		}
	}
}

// refusedInvites makes one invite of each kind that exists but is
// refused, through the admin API, and returns their codes: one expired,
// one used up, one revoked. Notes of one length, so that the records
// differ in what they say but not in what they cost to read.
func (e *env) refusedInvites() []string {
	e.t.Helper()
	expired, _ := e.createInvite(1, "1ms", "note 90")
	expiresAt := time.Now().Add(time.Millisecond)
	usedUp, _ := e.createInvite(1, "", "note 91")
	revoked, id := e.createInvite(3, "", "note 92")
	if status := e.adminPost("/api/invites/"+id+"/revoke", nil, nil); status != http.StatusOK {
		e.t.Fatalf("revoke invite: status %d", status)
	}
	body, _ := json.Marshal(map[string]string{"code": usedUp, "email": "first@example.com"})
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.proc.Addr+"/v1/invites/verify", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if a := do(adminClient, req); a.status != http.StatusOK {
		e.t.Fatalf("redeem the one-use invite: %d %v", a.status, a.err)
	}
	// The expired one's millisecond has passed while the others were made
	// (the server and the test share the clock); a verification would
	// redeem it if not.
	time.Sleep(time.Until(expiresAt))
	return []string{expired, usedUp, revoked}
}

// createInvite makes an invite through the admin API and returns its
// code and id.
func (e *env) createInvite(uses int, expires, note string) (code, id string) {
	e.t.Helper()
	var out struct {
		ID   string `json:"id"`
		Code string `json:"code"`
	}
	req := map[string]any{"uses": uses, "expires": expires, "note": note}
	if status := e.adminPost("/api/invites", req, &out); status != http.StatusCreated || out.Code == "" {
		e.t.Fatalf("create invite: status %d %+v", status, out)
	}
	return out.Code, out.ID
}

// adminPost posts body as JSON to the admin API and decodes the answer
// into out (if not nil); it returns the status.
func (e *env) adminPost(path string, body, out any) int {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+e.admin+path, bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
		}
	}
	return resp.StatusCode
}

// median returns the median of v, which it leaves alone.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianInterval returns the median of v and its distribution-free 95%
// interval: the order statistics n/2 ± 1.96·√n/2 (the sign test's).
func medianInterval(v []float64) (m, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	half := int(math.Ceil(1.96 * math.Sqrt(float64(n)) / 2))
	return median(s), s[max(0, n/2-half)], s[min(n-1, (n-1)/2+half)]
}
