package admin

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage"
)

const testAdminToken = "admin-secret-for-tests"

// testAdmin is the admin API on a database of its own, served on
// loopback, with user alice and her API key. The tests that drive it
// beside the public listener (a request's refusal on the dashboard, a key
// made here used there) are the public API's, in server/api.
type testAdmin struct {
	*Server
	admin *httptest.Server
	db    *storage.DB
	keys  *keys.Keyring
	brake state.Brake
	key   string // an API key of user "alice"
}

// adminOptions change newTestAdmin's defaults.
type adminOptions struct {
	cfg     func(*edge.Config)   // the [server] section's changes
	clock   func() time.Time     // default time.Now
	service ServiceRefusalReader // the service's refusals; nil: one instance
	logTo   io.Writer            // default discarded
}

// newTestAdmin builds the admin API of o.
func newTestAdmin(t *testing.T, o adminOptions) *testAdmin {
	t.Helper()
	c := edge.Config{}
	if o.cfg != nil {
		o.cfg(&c)
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	log := slog.New(slog.DiscardHandler)
	if o.logTo != nil {
		log = slog.New(slog.NewTextHandler(o.logTo, nil))
	}
	e, err := edge.New(c, edge.Options{Logger: log, Now: o.clock})
	if err != nil {
		t.Fatal(err)
	}
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	plans := keys.NewPlans(map[string]budget.Plan{"free": {MonthlyQuota: 100}})
	kr, err := keys.NewKeyring(db, plans.Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := invites.NewKey([]byte("a server secret for the tests"))
	if err != nil {
		t.Fatal(err)
	}
	codes, err := invites.NewCodes(db, invites.Options{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := state.LoadLayers(db, limiter.Config{}, budget.Config{}, time.UTC, o.clock(), log)
	if err != nil {
		t.Fatal(err)
	}
	op := operator.New(kr, codes, operator.Layers{Attempts: layers.Attempts, Quotas: layers.Quotas, Brake: layers.Brake}, db, plans.All, time.UTC, operator.Options{Now: o.clock})
	s, err := New(e, Deps{Operator: op, ServiceRefusals: o.service, AdminToken: testAdminToken, Logger: log, Now: o.clock})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	secret, _, err := kr.Create("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	return &testAdmin{Server: s, admin: srv, db: db, keys: kr, brake: layers.Brake, key: secret}
}

// keyOf returns the id of user's one key.
func (e *testAdmin) keyOf(t *testing.T, user string) string {
	t.Helper()
	list, err := e.keys.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range list {
		if k.UserID == user {
			return k.ID
		}
	}
	t.Fatalf("no key of %s in %+v", user, list)
	return ""
}

func adminClient(e *testAdmin) *operator.AdminClient {
	return operator.NewAdminClient(strings.TrimPrefix(e.admin.URL, "http://"), testAdminToken)
}

func do(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

func mustRequest(t *testing.T, method, url, token string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// scrape reads the admin listener's /metrics.
func scrape(t *testing.T, a *testAdmin) string {
	t.Helper()
	resp, data := do(t, mustRequest(t, http.MethodGet, a.admin.URL+"/metrics", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %d", resp.StatusCode)
	}
	return string(data)
}
