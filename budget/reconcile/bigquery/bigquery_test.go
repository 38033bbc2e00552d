package bigquery

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget/reconcile"
)

// fakeBigQuery speaks the parts of BigQuery's REST API the client uses,
// as documented: an OAuth token endpoint for the service account's
// signed assertion, jobs.query (POST .../projects/P/queries) that answers
// an unfinished job, and jobs.getQueryResults (GET .../queries/JOB) that
// pages the rows by pageToken, in the f/v row format with TIMESTAMPs as
// seconds since the epoch.
type fakeBigQuery struct {
	t        *testing.T
	rows     [][]any // cells in schema order
	pageSize int
	gets     atomic.Int32
	query    queryRequest
}

var fakeSchema = schema{Fields: []field{{"usage_start_time", "TIMESTAMP"}, {"usage_end_time", "TIMESTAMP"}, {"cost", "FLOAT"}, {"currency", "STRING"},
	{"service", "STRING"}, {"sku", "STRING"}, {"amount", "FLOAT"}, {"unit", "STRING"}, {"credits", "FLOAT"}}}

func (f *fakeBigQuery) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/token":
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
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"access_token":"fake-access-token","token_type":"Bearer","expires_in":3600}`)
		return
	case r.Header.Get("Authorization") != "Bearer fake-access-token":
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"code":401,"message":"Request is missing required authentication credential.","status":"UNAUTHENTICATED"}}`)
		return
	case r.Method == http.MethodPost && r.URL.Path == "/bigquery/v2/projects/ocr-billing/queries":
		if err := json.NewDecoder(r.Body).Decode(&f.query); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The job is not done within the call: the client must ask
		// getQueryResults.
		writeJSON(w, map[string]any{"kind": "bigquery#queryResponse", "jobComplete": false,
			"jobReference": jobReference{ProjectID: "ocr-billing", JobID: "job_abc123", Location: "US"}})
		return
	case r.Method == http.MethodGet && r.URL.Path == "/bigquery/v2/projects/ocr-billing/queries/job_abc123":
		f.gets.Add(1)
		if r.URL.Query().Get("location") != "US" {
			http.Error(w, "no location", http.StatusNotFound)
			return
		}
		start := 0
		if tok := r.URL.Query().Get("pageToken"); tok != "" {
			fmt.Sscanf(tok, "page-%d", &start)
		}
		end := min(start+f.pageSize, len(f.rows))
		page := map[string]any{"kind": "bigquery#getQueryResultsResponse", "jobComplete": true, "schema": fakeSchema,
			"jobReference": jobReference{ProjectID: "ocr-billing", JobID: "job_abc123", Location: "US"},
			"totalRows":    fmt.Sprint(len(f.rows)), "rows": cells(f.rows[start:end])}
		if end < len(f.rows) {
			page["pageToken"] = fmt.Sprintf("page-%d", end)
		}
		writeJSON(w, page)
		return
	}
	f.t.Errorf("unexpected %s %s", r.Method, r.URL)
	http.NotFound(w, r)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// cells writes rows in the f/v format: every value a string, or null.
func cells(rows [][]any) []map[string]any {
	var out []map[string]any
	for _, r := range rows {
		var f []map[string]any
		for _, v := range r {
			if v == nil {
				f = append(f, map[string]any{"v": nil})
				continue
			}
			f = append(f, map[string]any{"v": fmt.Sprint(v)})
		}
		out = append(out, map[string]any{"f": f})
	}
	return out
}

// serviceAccount writes a service account key file whose token endpoint
// is the fake's, and returns its path.
func serviceAccount(t *testing.T, tokenURI string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := json.Marshal(map[string]string{"type": "service_account", "project_id": "ocr-billing", "private_key_id": "k1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), "client_email": "reconcile@ocr-billing.iam.gserviceaccount.com",
		"client_id": "1", "token_uri": tokenURI})
	path := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestQueryPagesThroughTheFake reads 7 rows 3 a page through the fake:
// the job left unfinished by jobs.query, then three pages of
// getQueryResults, every row decoded as the export wrote it.
func TestQueryPagesThroughTheFake(t *testing.T) {
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ts := func(h int) string {
		return strconv.FormatFloat(float64(day.Add(time.Duration(h)*time.Hour).Unix()), 'E', -1, 64)
	}
	fake := &fakeBigQuery{t: t, pageSize: 3}
	for h := range 7 {
		fake.rows = append(fake.rows, []any{ts(h), ts(h + 1), 0.25, "USD", "Gemini API", "Gemini 3.5 Flash Lite Input Tokens", 2500000.0, "count", -0.05})
	}
	fake.rows[6][6], fake.rows[6][8] = nil, 0.0 // a row without usage
	srv := httptest.NewServer(fake)
	defer srv.Close()
	path := serviceAccount(t, srv.URL+"/token")
	c, err := New(context.Background(), "ocr-billing.billing_export.gcp_billing_export_v1_01A2B3_C4D5E6_F7A8B9",
		Options{Endpoint: srv.URL + "/bigquery/v2", Getenv: func(k string) string { return map[string]string{CredentialsEnv: path}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	var rows []reconcile.Row
	err = c.Rows(context.Background(), reconcile.DefaultServices, day, day.AddDate(0, 0, 1), func(r reconcile.Row) error {
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 || fake.gets.Load() != 3 {
		t.Fatalf("%d rows in %d pages, want 7 in 3", len(rows), fake.gets.Load())
	}
	r := rows[2]
	if !r.Start.Equal(day.Add(2*time.Hour)) || r.CostMicro != 250000 || r.CreditsMicro != -50000 || r.Quantity != 2.5e6 || !r.HasQuantity ||
		r.Service != "Gemini API" || r.Description != "Gemini 3.5 Flash Lite Input Tokens" || r.Unit != "count" || r.Currency != "USD" {
		t.Errorf("row 3: %+v", r)
	}
	if rows[6].HasQuantity {
		t.Error("a null usage.amount read as a quantity")
	}
	if !strings.Contains(fake.query.Query, "`ocr-billing.billing_export.gcp_billing_export_v1_01A2B3_C4D5E6_F7A8B9`") || fake.query.UseLegacySQL ||
		len(fake.query.QueryParameters) != 3 || fake.query.QueryParameters[0].ParameterValue.Value != "2026-12-01T00:00:00Z" {
		t.Errorf("the query sent: %+v", fake.query)
	}
	var sum int64
	for _, r := range rows {
		sum += r.CostMicro
	}
	if math.Abs(float64(sum)-1750000) > 0 {
		t.Errorf("sum %d", sum)
	}
}

// A refused token or query is an error that says what BigQuery said.
func TestQueryRefused(t *testing.T) {
	fake := &fakeBigQuery{t: t, pageSize: 3}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	if _, err := New(context.Background(), "ocr-billing.d.t", Options{Getenv: func(string) string { return "" }}); err == nil || !strings.Contains(err.Error(), CredentialsEnv) {
		t.Errorf("no credentials: %v", err)
	}
	path := serviceAccount(t, srv.URL+"/token")
	c, err := New(context.Background(), "other-project.d.t", Options{Endpoint: srv.URL + "/bigquery/v2", Getenv: func(string) string { return path }})
	if err != nil {
		t.Fatal(err)
	}
	c.hc.Transport = http.DefaultTransport // no token: the fake refuses
	err = c.Rows(context.Background(), reconcile.DefaultServices, time.Now(), time.Now(), func(reconcile.Row) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "missing required authentication") {
		t.Errorf("refused: %v", err)
	}
}
