package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"breakwater/server/edgetest"
	"breakwater/server/keys"
	"breakwater/storage"
)

// TestUserIDsNormalised: ids that differ in case, surrounding space or
// Unicode normalisation form name one user, who shares one set of
// counters whichever key the request carries; the operator finds the user
// by any spelling, over the admin API as on the database.
func TestUserIDsNormalised(t *testing.T) {
	e := newEnv(t, envOptions{})
	ac := adminClient(e)
	ctx := context.Background()
	img := pngBytes(t, 8, 8)

	groups := []struct {
		want      string
		spellings []string
	}{
		{"alice", []string{"Alice", " alice", "ALICE\t"}}, // e.key is alice's already
		{"caf\u00e9", []string{"caf\u00e9", "cafe\u0301", "CAFE\u0301 "}},
	}
	for _, g := range groups {
		t.Run(g.want, func(t *testing.T) {
			secrets := []string{}
			if g.want == "alice" {
				secrets = append(secrets, e.key)
			}
			for i, spelling := range g.spellings {
				var secret string
				var info keys.KeyInfo
				var err error
				if i%2 == 0 { // both paths: the admin API and the keyring itself
					secret, info, err = ac.CreateKey(ctx, spelling, "")
				} else {
					secret, info, err = e.keys.Create(spelling, "")
				}
				if err != nil {
					t.Fatalf("create key for %q: %v", spelling, err)
				}
				if info.UserID != g.want {
					t.Errorf("key for %q belongs to %q, want %q", spelling, info.UserID, g.want)
				}
				secrets = append(secrets, secret)
			}
			for _, k := range secrets {
				resp, data := e.post(k, "image/png", img)
				decodeOK(t, resp, data)
			}
			if got, want := e.quotas.Used(g.want, e.now), int64(len(secrets)); got != want {
				t.Errorf("quota of %q used %d, want %d (one user, one counter)", g.want, got, want)
			}
			for _, spelling := range g.spellings {
				list, err := ac.Usage(ctx, spelling)
				if err != nil || len(list) != 1 || list[0].User != g.want || list[0].ReadsMonth != int64(len(secrets)) {
					t.Errorf("usage %q: %+v, %v; want one row of %q with %d reads", spelling, list, err, g.want, len(secrets))
				}
			}
		})
	}
	n := 0
	for _, u := range e.keys.Users() {
		if strings.EqualFold(u.ID, "alice") || strings.HasPrefix(strings.ToLower(u.ID), "caf") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("users %+v: want one alice and one café", e.keys.Users())
	}

	// A ban given with another spelling reaches every key of the user.
	if _, err := ac.SetBanned(ctx, " ALICE", true, false); err != nil {
		t.Fatal(err)
	}
	resp, data := e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusForbidden, "banned")
}

// TestUserIDInvisibleRefused: an id holding a character that draws
// nothing is refused, with an error that names the rule, both when a key
// is made and when a user is looked up.
func TestUserIDInvisibleRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	ac := adminClient(e)
	ctx := context.Background()
	for _, id := range []string{"ali\u200bce", "alice\u200d", "\u202ealice", "alice\ufe0f", "alice\u3164"} {
		_, _, err := ac.CreateKey(ctx, id, "")
		if err == nil || !strings.Contains(err.Error(), "invisible character") {
			t.Errorf("create key for %q: %v; want a refusal naming the invisible character", id, err)
		}
		if _, _, err := e.keys.Create(id, ""); !errors.Is(err, keys.ErrBadUserID) || !strings.Contains(err.Error(), "invisible character") {
			t.Errorf("keyring create %q: %v", id, err)
		}
		if _, err := ac.SetBanned(ctx, id, true, true); err == nil || !strings.Contains(err.Error(), "invisible character") {
			t.Errorf("ban %q: %v", id, err)
		}
	}
	if len(e.keys.Users()) != 1 {
		t.Errorf("users %+v, want alice alone", e.keys.Users())
	}
}

// TestAPIKeyIDsCannotEnterJWTNamespace: no API key can be made for an id
// that a token could act as.
func TestAPIKeyIDsCannotEnterJWTNamespace(t *testing.T) {
	e := newEnv(t, envOptions{plans: map[string]int64{"pro": 1000}})
	for _, id := range []string{"jwt:alice", "JWT:alice", " jwt:user_2abc"} {
		if _, _, err := e.keys.Create(id, ""); !errors.Is(err, keys.ErrReservedUserID) {
			t.Errorf("create key for %q: %v, want keys.ErrReservedUserID", id, err)
		}
	}
	if _, _, err := adminClient(e).CreateKey(context.Background(), "jwt:alice", ""); err == nil || !strings.Contains(err.Error(), "reserved for sign-in (JWT) users") {
		t.Errorf("admin create key for jwt:alice: %v, want the reservation explained", err)
	}
	if _, err := e.keys.SetBanned("jwt:alice", true, true); err != nil {
		t.Fatalf("ban a JWT user: %v", err)
	}
	if _, err := e.keys.SetPlan("jwt:alice", "pro"); !errors.Is(err, keys.ErrReservedUserID) {
		t.Errorf("set-plan of a JWT user: %v, want keys.ErrReservedUserID", err)
	}
}

// TestJWTSubDoesNotShareAPIKeyUser: a token whose sub equals an API-key
// user's id is its own user: it neither uses up nor sees that user's
// quota and daily attempts, and that user's ban does not reach it.
func TestJWTSubDoesNotShareAPIKeyUser(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	f := newFakeJWKS(t, rs)
	clk := newClock(jwtStart)
	e := newEnv(t, envOptions{clock: clk.now, jwt: f.config(), quota: 2, attempts: 3})
	img := pngBytes(t, 8, 8)
	token := rs.sign(t, with(claimsAt(clk.now()), jwt.MapClaims{"sub": "alice"}))

	for range 2 {
		resp, data := e.post(e.key, "image/png", img)
		decodeOK(t, resp, data)
	}
	resp, data := e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "quota_exceeded")

	resp, data = e.post(token, "image/png", img)
	b := decodeOK(t, resp, data)
	if b.Quota.Used != 1 {
		t.Errorf("the JWT user's quota shows %d used, want 1 (its own)", b.Quota.Used)
	}
	if got := e.quotas.Used("alice", clk.now()); got != 2 {
		t.Errorf("alice's quota used %d, want 2 (the token's read is not hers)", got)
	}
	if got := e.quotas.Used("jwt:alice", clk.now()); got != 1 {
		t.Errorf("jwt:alice quota used %d, want 1", got)
	}
	if got, want := e.attempts.Count("alice", clk.now()), int64(2); got != want {
		t.Errorf("alice's attempts %d, want %d", got, want)
	}
	if got, want := e.attempts.Count("jwt:alice", clk.now()), int64(1); got != want {
		t.Errorf("jwt:alice's attempts %d, want %d", got, want)
	}

	if _, err := adminClient(e).SetBanned(context.Background(), "alice", true, false); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(token, "image/png", img)
	decodeOK(t, resp, data)
}

// TestUnnormalisedStoredIDsKeepWorking: a database written before ids
// were normalised may hold "Alice" and "bob " as they were typed. Their
// keys still work, the operator reaches them by their old spelling and by
// the normal one, a new key for "ALICE" joins the old "Alice", and where
// two old users share a normal form the operator is asked to pick one.
func TestUnnormalisedStoredIDsKeepWorking(t *testing.T) {
	dir := t.TempDir()
	db, err := storage.Open(filepath.Join(dir, "bw.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	old := map[string]string{} // user -> secret
	for i, user := range []string{"Alice", "bob ", "Carol", "carol"} {
		secret := "bw_" + strings.Repeat(string(keys.Base62[i]), 32)
		k := keys.Key{ID: "key_old" + string(keys.Base62[i]), UserID: user, CreatedAt: at}
		k.Hash = sha256Sum(secret)
		if err := db.CreateKey(k, keys.User{Plan: "free"}); err != nil {
			t.Fatal(err)
		}
		old[user] = secret
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t, envOptions{dir: dir})
	img := pngBytes(t, 8, 8)
	for user, secret := range old {
		id, _, ok := e.keys.Authenticate(secret)
		if !ok || id.UserID != user {
			t.Errorf("old key of %q: %+v %v", user, id, ok)
		}
		resp, data := e.post(secret, "image/png", img)
		decodeOK(t, resp, data)
	}
	_, info, err := e.keys.Create("ALICE", "")
	if err != nil || info.UserID != "Alice" {
		t.Errorf("new key for ALICE: %+v, %v; want it to join the stored Alice", info, err)
	}
	for _, name := range []string{"bob ", "bob", "BOB"} {
		if got, err := e.keys.Resolve(name); err != nil || got != "bob " {
			t.Errorf("Resolve(%q) = %q, %v; want the stored %q", name, got, err, "bob ")
		}
	}
	if got, err := e.keys.Resolve("Carol"); err != nil || got != "Carol" {
		t.Errorf("Resolve(Carol) = %q, %v: an exact stored id wins", got, err)
	}
	if _, err := e.keys.Resolve("CAROL"); err != nil {
		// "carol" is stored exactly as CAROL normalises: that one.
		t.Errorf("Resolve(CAROL): %v", err)
	}
	if _, err := e.keys.SetBanned(" Carol", true, false); err != nil {
		t.Errorf("ban ' Carol': %v", err)
	}
	if !e.keys.Banned("carol") {
		t.Error("' Carol' normalises to carol, which is stored: carol should be banned")
	}
}

// TestAmbiguousStoredIDs: two old users whose ids normalise alike, neither
// stored in normal form, cannot be told apart by a third spelling.
func TestAmbiguousStoredIDs(t *testing.T) {
	dir := t.TempDir()
	db, err := storage.Open(filepath.Join(dir, "bw.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	for i, user := range []string{"Dave", "DAVE"} {
		k := keys.Key{ID: "key_" + user, UserID: user, CreatedAt: at, Hash: sha256Sum("bw_" + strings.Repeat(string(keys.Base62[i]), 32))}
		if err := db.CreateKey(k, keys.User{Plan: "free"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{dir: dir})
	if _, err := e.keys.Resolve("dave"); !errors.Is(err, keys.ErrAmbiguousUserID) || !strings.Contains(err.Error(), `"DAVE" "Dave"`) {
		t.Errorf("Resolve(dave): %v, want keys.ErrAmbiguousUserID naming both", err)
	}
	if _, err := adminClient(e).SetBanned(context.Background(), "dave", true, false); err == nil || !strings.Contains(err.Error(), "could be any of") {
		t.Errorf("ban dave over the admin API: %v, want the ambiguity explained", err)
	}
	if got, err := e.keys.Resolve("Dave"); err != nil || got != "Dave" {
		t.Errorf("Resolve(Dave) = %q, %v", got, err)
	}
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
