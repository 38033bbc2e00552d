// Package edgetest holds the helpers the tests of the public API
// (server/api) and the admin API (server/admin) share: reading a
// problem+json answer, waiting for a server's own state, test bytes.
// server/edge's own tests keep theirs: a package of edge's cannot import
// one that imports it.
package edgetest

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"breakwater/server/edge"
)

// DecodeProblem fails t unless resp (its body read into data) is a
// problem+json answer of status and code with a type and a title, and
// returns the problem.
func DecodeProblem(t testing.TB, resp *http.Response, data []byte, status int, code string) edge.Problem {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p edge.Problem
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	if p.Code != code || p.Status != status || p.Type == "" || p.Title == "" {
		t.Errorf("problem %+v, want code %q status %d with type and title", p, code, status)
	}
	return p
}

// WaitFor polls cond, which watches the server's own state, until it
// holds or 5 seconds pass.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// RandomBytes is n bytes that do not compress, the same for the same n.
func RandomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}
