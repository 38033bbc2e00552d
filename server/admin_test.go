package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"breakwater/storage"
)

func TestAdminNeedsToken(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, token := range []string{"", "wrong", testAdminToken + "x", e.key} {
		resp, data := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", token))
		decodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
	}
	resp, _ := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

func TestAdminClientManagesKeys(t *testing.T) {
	e := newEnv(t, envOptions{plans: map[string]int64{"pro": 1000}})
	ctx := context.Background()
	ac := NewAdminClient(strings.TrimPrefix(e.admin.URL, "http://"), testAdminToken)

	secret, info, err := ac.CreateKey(ctx, "carol", "pro")
	if err != nil {
		t.Fatal(err)
	}
	if info.UserID != "carol" || info.Plan != "pro" || !strings.HasPrefix(secret, "bw_") || len(secret) < 35 {
		t.Errorf("created %+v with %q", info, secret)
	}
	resp, data := e.post(secret, "image/png", pngBytes(t, 8, 8))
	if got := decodeOK(t, resp, data).Quota.Limit; got != 1000 {
		t.Errorf("pro quota limit %d, want 1000", got)
	}

	list, err := ac.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("%d keys, want 2", len(list))
	}
	if _, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", testAdminToken)); strings.Contains(string(body), secret) || strings.Contains(string(body), e.key) {
		t.Error("keys list shows a secret")
	}

	if _, err := ac.RevokeKey(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(secret, "image/png", pngBytes(t, 8, 8))
	decodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")

	if _, err := ac.RevokeKey(ctx, "key_nope"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("revoke unknown: %v, want ErrNotFound", err)
	}
	if _, _, err := ac.CreateKey(ctx, "dave", "platinum"); err == nil || !strings.Contains(err.Error(), "unknown plan") {
		t.Errorf("unknown plan: %v", err)
	}
	if _, _, err := ac.CreateKey(ctx, "bad\x00id", ""); err == nil {
		t.Error("control character in user id accepted")
	}
}

func TestKeyringCreate(t *testing.T) {
	e := newEnv(t, envOptions{plans: map[string]int64{"pro": 1000}})
	cases := []struct {
		name, user, plan string
		wantPlan         string
		wantErr          error
	}{
		{"new user gets free", "u1", "", "free", nil},
		{"named plan", "u2", "pro", "pro", nil},
		{"existing user keeps plan", "u2", "", "pro", nil},
		{"unknown plan", "u3", "gold", "", ErrUnknownPlan},
		{"empty id", "", "", "", ErrBadUserID},
		{"control char", "a\nb", "", "", ErrBadUserID},
		{"too long", strings.Repeat("x", 129), "", "", ErrBadUserID},
		{"max length", strings.Repeat("x", 128), "", "free", nil},
		{"unicode ok", "josé@example.com", "", "free", nil},
		{"invalid utf8", "a\xffb", "", "", ErrBadUserID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			secret, info, err := e.keys.Create(c.user, c.plan)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if err != nil {
				return
			}
			if info.Plan != c.wantPlan {
				t.Errorf("plan %q, want %q", info.Plan, c.wantPlan)
			}
			if !validKeyShape(secret) {
				t.Errorf("secret %q has the wrong shape", secret)
			}
			id, ok := e.keys.Authenticate(secret)
			if !ok || id.UserID != c.user || id.Plan != c.wantPlan {
				t.Errorf("authenticate: %+v %v", id, ok)
			}
		})
	}
}

func TestRandomBase62(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		s := randomBase62(keySecretLen)
		if len(s) != keySecretLen || seen[s] {
			t.Fatalf("bad or repeated secret %q", s)
		}
		seen[s] = true
	}
}
