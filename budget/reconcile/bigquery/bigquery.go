// Package bigquery reads Cloud Billing's standard usage cost export from
// BigQuery over its REST API (jobs.query, then getQueryResults page by
// page), as the rows reconcile reads from a file. It authenticates with
// the service account of GOOGLE_APPLICATION_CREDENTIALS.
package bigquery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"breakwater/budget/reconcile"
)

// DefaultEndpoint is BigQuery's REST API.
const DefaultEndpoint = reconcile.DefaultBigQueryEndpoint

// Scope is the OAuth scope the client asks for: reading tables and
// running queries.
const Scope = "https://www.googleapis.com/auth/bigquery.readonly"

// CredentialsEnv names the service account's key file.
const CredentialsEnv = "GOOGLE_APPLICATION_CREDENTIALS"

// PageRows is how many rows one page asks for.
const PageRows = 5000

// Client queries one export table.
type Client struct {
	project  string // the job's project: the table's
	table    string // "project.dataset.table"
	endpoint string
	hc       *http.Client
}

// Options are the client's optional parts.
type Options struct {
	// Endpoint replaces DefaultEndpoint (a test's fake).
	Endpoint string
	// Getenv reads CredentialsEnv; nil: os.Getenv.
	Getenv func(string) string
	// Timeout bounds each HTTP exchange; default 60 s.
	Timeout time.Duration
}

// New returns a client of table ("project.dataset.table") that
// authenticates with the service account key file CredentialsEnv names.
func New(ctx context.Context, table string, o Options) (*Client, error) {
	project, _, ok := strings.Cut(table, ".")
	if !ok || project == "" {
		return nil, fmt.Errorf("bigquery: %q is not project.dataset.table", table)
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	path := o.Getenv(CredentialsEnv)
	if path == "" {
		return nil, fmt.Errorf("bigquery: %s is not set: name the service account's key file (a BigQuery Data Viewer and Job User on %s)", CredentialsEnv, project)
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bigquery: %s: %w", CredentialsEnv, err)
	}
	creds, err := google.CredentialsFromJSON(ctx, key, Scope)
	if err != nil {
		return nil, fmt.Errorf("bigquery: the key file of %s: %w", CredentialsEnv, err)
	}
	c := &Client{project: project, table: table, endpoint: strings.TrimSuffix(cmpOr(o.Endpoint, DefaultEndpoint), "/")}
	c.hc = oauth2.NewClient(ctx, creds.TokenSource) // the token is fetched, and renewed, as requests need it
	c.hc.Timeout = 60 * time.Second
	if o.Timeout > 0 {
		c.hc.Timeout = o.Timeout
	}
	return c, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// query is the SQL of Rows: the fields reconcile reads, credits summed
// per row, the Gemini API's services only, by charge period.
const query = "SELECT usage_start_time, usage_end_time, cost, currency, service.description AS service, sku.description AS sku, " +
	"usage.amount AS amount, usage.unit AS unit, (SELECT IFNULL(SUM(c.amount), 0) FROM UNNEST(credits) AS c) AS credits " +
	"FROM `%s` WHERE usage_start_time >= @from AND usage_start_time < @to AND LOWER(service.description) IN UNNEST(@services) " +
	"ORDER BY usage_start_time"

// Rows calls fn with each row of the export whose charge period starts in
// [from, to) and whose service is one of services, page by page.
func (c *Client) Rows(ctx context.Context, services []string, from, to time.Time, fn func(reconcile.Row) error) error {
	lower := make([]queryParamValue, len(services))
	for i, s := range services {
		lower[i] = queryParamValue{Value: strings.ToLower(strings.TrimSpace(s))}
	}
	req := queryRequest{
		Query: fmt.Sprintf(query, c.table), UseLegacySQL: false, ParameterMode: "NAMED", MaxResults: PageRows, TimeoutMs: 30000,
		QueryParameters: []queryParam{
			{Name: "from", ParameterType: paramType{Type: "TIMESTAMP"}, ParameterValue: &queryParamValue{Value: from.UTC().Format(time.RFC3339Nano)}},
			{Name: "to", ParameterType: paramType{Type: "TIMESTAMP"}, ParameterValue: &queryParamValue{Value: to.UTC().Format(time.RFC3339Nano)}},
			{Name: "services", ParameterType: paramType{Type: "ARRAY", ArrayType: &paramType{Type: "STRING"}}, ParameterValue: &queryParamValue{ArrayValues: lower}},
		},
	}
	var page queryResponse
	if err := c.do(ctx, http.MethodPost, c.endpoint+"/projects/"+url.PathEscape(c.project)+"/queries", req, &page); err != nil {
		return err
	}
	n := 0
	for {
		if page.JobComplete {
			for _, r := range page.Rows {
				n++
				row, err := decodeRow(r, page.Schema)
				if err != nil {
					return fmt.Errorf("bigquery: row %d: %w", n, err)
				}
				row.Line = n
				if err := fn(row); err != nil {
					return err
				}
			}
			if page.PageToken == "" {
				return nil
			}
		}
		q := url.Values{"maxResults": {strconv.Itoa(PageRows)}, "timeoutMs": {"30000"}}
		if page.PageToken != "" {
			q.Set("pageToken", page.PageToken)
		}
		if page.JobReference.Location != "" {
			q.Set("location", page.JobReference.Location)
		}
		if page.JobReference.JobID == "" {
			return errors.New("bigquery: the answer names no job to read the rest of the rows from")
		}
		next := c.endpoint + "/projects/" + url.PathEscape(cmpOr(page.JobReference.ProjectID, c.project)) + "/queries/" + url.PathEscape(page.JobReference.JobID) + "?" + q.Encode()
		ref := page.JobReference
		page = queryResponse{}
		if err := c.do(ctx, http.MethodGet, next, nil, &page); err != nil {
			return err
		}
		if page.JobReference.JobID == "" {
			page.JobReference = ref
		}
	}
}

// do sends one request and decodes its JSON answer into out; an answer
// other than 200 is an error with BigQuery's message.
func (c *Client) do(ctx context.Context, method, u string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("bigquery: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e errorResponse
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		return fmt.Errorf("bigquery: %s %s: %s: %s", method, strings.SplitN(u, "?", 2)[0], resp.Status, e.Error.Message)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("bigquery: the answer: %w", err)
	}
	return nil
}
