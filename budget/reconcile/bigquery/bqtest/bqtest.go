// Package bqtest is a local fake of the parts of BigQuery's REST API the
// reconcile client uses, as Google documents them, for tests: an OAuth
// token endpoint that takes a service account's signed assertion,
// jobs.query (POST .../projects/P/queries), which answers an unfinished
// job, and jobs.getQueryResults (GET .../projects/P/queries/JOB), which
// pages the rows by pageToken in the f/v row format.
package bqtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Project and Job are the fake's project and the job it names.
const (
	Project = "ocr-billing"
	Job     = "job_abc123"
	Token   = "fake-access-token"
	// Scope is the scope the fake's token endpoint requires.
	Scope = "https://www.googleapis.com/auth/bigquery.readonly"
)

// Columns are the columns of the fake's answers, in order.
var Columns = [][2]string{{"usage_start_time", "TIMESTAMP"}, {"usage_end_time", "TIMESTAMP"}, {"cost", "FLOAT"}, {"currency", "STRING"},
	{"service", "STRING"}, {"sku", "STRING"}, {"amount", "FLOAT"}, {"unit", "STRING"}, {"credits", "FLOAT"}}

// Row is one row of the export as the fake answers it.
type Row struct {
	Start, End time.Time
	Cost       float64
	Currency   string
	Service    string
	SKU        string
	Amount     *float64 // nil: null
	Unit       string
	Credits    float64
}

// Fake is the fake API; its zero PageSize is 3.
type Fake struct {
	URL      string // the server's base; Endpoint is the API's
	PageSize int

	mu      sync.Mutex
	rows    []Row
	queries []map[string]any
	held    chan struct{} // non-nil: a query waits for it to close (Hold)
	gets    atomic.Int32
	srv     *httptest.Server
}

// Hold makes each query, once received and counted, wait for release
// before it is answered: a test sees who else queries while one is in
// flight.
func (f *Fake) Hold() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := make(chan struct{})
	f.held = held
	var once sync.Once
	return func() { once.Do(func() { close(held) }) }
}

// New starts a fake serving rows, closed when t ends.
func New(t testing.TB, rows ...Row) *Fake {
	f := &Fake{PageSize: 3, rows: rows}
	f.srv = httptest.NewServer(f)
	f.URL = f.srv.URL
	t.Cleanup(f.srv.Close)
	return f
}

// Endpoint is the REST API's base URL on the fake.
func (f *Fake) Endpoint() string { return f.URL + "/bigquery/v2" }

// SetRows replaces the rows the next query answers.
func (f *Fake) SetRows(rows ...Row) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows = rows
}

// Pages counts the getQueryResults calls answered.
func (f *Fake) Pages() int { return int(f.gets.Load()) }

// Queries are the jobs.query bodies received, in order.
func (f *Fake) Queries() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.queries...)
}

func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/token":
		f.token(w, r)
	case r.Header.Get("Authorization") != "Bearer "+Token:
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"code":401,"message":"Request is missing required authentication credential.","status":"UNAUTHENTICATED"}}`)
	case r.Method == http.MethodPost && r.URL.Path == "/bigquery/v2/projects/"+Project+"/queries":
		var q map[string]any
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.queries = append(f.queries, q)
		held := f.held
		f.mu.Unlock()
		if held != nil {
			select {
			case <-held:
			case <-r.Context().Done():
				return
			}
		}
		// The job is not done within the call: the client must ask
		// getQueryResults for it.
		writeJSON(w, map[string]any{"kind": "bigquery#queryResponse", "jobComplete": false, "jobReference": f.ref()})
	case r.Method == http.MethodGet && r.URL.Path == "/bigquery/v2/projects/"+Project+"/queries/"+Job && r.URL.Query().Get("location") == "US":
		f.page(w, r)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"code":404,"message":"Not found: %s %s"}}`, r.Method, r.URL.Path)
	}
}

func (f *Fake) ref() map[string]string {
	return map[string]string{"projectId": Project, "jobId": Job, "location": "US"}
}

// token answers a signed assertion whose claims ask for Scope.
func (f *Fake) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Form.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	parts := strings.Split(r.Form.Get("assertion"), ".")
	claims, _ := base64.RawURLEncoding.DecodeString(parts[min(1, len(parts)-1)])
	if !strings.Contains(string(claims), Scope) {
		http.Error(w, `{"error":"invalid_scope"}`, http.StatusBadRequest)
		return
	}
	writeJSON(w, map[string]any{"access_token": Token, "token_type": "Bearer", "expires_in": 3600})
}

// page answers one page of rows from the pageToken on.
func (f *Fake) page(w http.ResponseWriter, r *http.Request) {
	f.gets.Add(1)
	f.mu.Lock()
	rows := f.rows
	f.mu.Unlock()
	start := 0
	if tok := r.URL.Query().Get("pageToken"); tok != "" {
		fmt.Sscanf(tok, "page-%d", &start)
	}
	end := min(start+f.PageSize, len(rows))
	var fields []map[string]string
	for _, c := range Columns {
		fields = append(fields, map[string]string{"name": c[0], "type": c[1], "mode": "NULLABLE"})
	}
	var out []map[string]any
	for _, row := range rows[start:end] {
		out = append(out, map[string]any{"f": row.cells()})
	}
	page := map[string]any{"kind": "bigquery#getQueryResultsResponse", "jobComplete": true, "jobReference": f.ref(),
		"schema": map[string]any{"fields": fields}, "totalRows": strconv.Itoa(len(rows)), "rows": out}
	if end < len(rows) {
		page["pageToken"] = fmt.Sprintf("page-%d", end)
	}
	writeJSON(w, page)
}

// cells is the row in the f/v format: every value a string, or null;
// TIMESTAMPs as seconds since the epoch in E notation.
func (r Row) cells() []map[string]any {
	ts := func(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMicro())/1e6, 'E', -1, 64) }
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	var amount any
	if r.Amount != nil {
		amount = num(*r.Amount)
	}
	var out []map[string]any
	for _, v := range []any{ts(r.Start), ts(r.End), num(r.Cost), r.Currency, r.Service, r.SKU, amount, r.Unit, num(r.Credits)} {
		out = append(out, map[string]any{"v": v})
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// ServiceAccount writes a service account key file (a new RSA key) whose
// token endpoint is the fake's, and returns its path.
func (f *Fake) ServiceAccount(t testing.TB) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := json.Marshal(map[string]string{"type": "service_account", "project_id": Project, "private_key_id": "k1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), "client_email": "reconcile@" + Project + ".iam.gserviceaccount.com",
		"client_id": "1", "token_uri": f.URL + "/token"})
	path := filepath.Join(t.TempDir(), "service-account.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
