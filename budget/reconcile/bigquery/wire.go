package bigquery

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"breakwater/budget/reconcile"
)

// The REST API's shapes (jobs.query and jobs.getQueryResults), the
// fields the client uses.
type (
	queryRequest struct {
		Query           string       `json:"query"`
		UseLegacySQL    bool         `json:"useLegacySql"`
		ParameterMode   string       `json:"parameterMode"`
		QueryParameters []queryParam `json:"queryParameters"`
		MaxResults      int          `json:"maxResults"`
		TimeoutMs       int          `json:"timeoutMs"`
	}
	queryParam struct {
		Name           string           `json:"name"`
		ParameterType  paramType        `json:"parameterType"`
		ParameterValue *queryParamValue `json:"parameterValue"`
	}
	paramType struct {
		Type      string     `json:"type"`
		ArrayType *paramType `json:"arrayType,omitempty"`
	}
	queryParamValue struct {
		Value       string            `json:"value,omitempty"`
		ArrayValues []queryParamValue `json:"arrayValues,omitempty"`
	}
	// queryResponse is both answers: a page of rows when JobComplete,
	// the job to ask again otherwise.
	queryResponse struct {
		JobComplete  bool         `json:"jobComplete"`
		JobReference jobReference `json:"jobReference"`
		Schema       schema       `json:"schema"`
		Rows         []tableRow   `json:"rows"`
		PageToken    string       `json:"pageToken"`
		TotalRows    string       `json:"totalRows"`
	}
	jobReference struct {
		ProjectID string `json:"projectId"`
		JobID     string `json:"jobId"`
		Location  string `json:"location"`
	}
	schema struct {
		Fields []field `json:"fields"`
	}
	field struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	// tableRow is a row as the API writes it: {"f":[{"v":...}, ...]},
	// its cells in the schema's order, each value a string or null.
	tableRow struct {
		F []struct {
			V *string `json:"v"`
		} `json:"f"`
	}
	errorResponse struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
)

// decodeRow reads a row of the query by its schema's names.
func decodeRow(r tableRow, s schema) (reconcile.Row, error) {
	cell := map[string]*string{}
	for i, f := range s.Fields {
		if i < len(r.F) {
			cell[f.Name] = r.F[i].V
		}
	}
	text := func(name string) (string, error) {
		v, ok := cell[name]
		if !ok {
			return "", fmt.Errorf("the answer has no column %s", name)
		}
		if v == nil {
			return "", nil
		}
		return *v, nil
	}
	number := func(name string) (float64, bool, error) {
		t, err := text(name)
		if err != nil || t == "" {
			return 0, false, err
		}
		f, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %q is not a number", name, t)
		}
		return f, true, nil
	}
	var row reconcile.Row
	var errs []error
	for name, dst := range map[string]*time.Time{"usage_start_time": &row.Start, "usage_end_time": &row.End} {
		secs, ok, err := number(name)
		if err == nil && !ok {
			err = fmt.Errorf("%s is null", name)
		}
		errs = append(errs, err)
		whole, frac := math.Modf(secs)
		*dst = time.Unix(int64(whole), int64(math.Round(frac*1e6))*1e3).UTC() // TIMESTAMP: seconds since the epoch
	}
	cost, _, err := number("cost")
	errs = append(errs, err)
	row.CostMicro = int64(math.Round(cost * 1e6))
	credits, _, err := number("credits")
	errs = append(errs, err)
	row.CreditsMicro = int64(math.Round(credits * 1e6))
	row.Quantity, row.HasQuantity, err = number("amount")
	errs = append(errs, err)
	for name, dst := range map[string]*string{"currency": &row.Currency, "service": &row.Service, "sku": &row.Description, "unit": &row.Unit} {
		*dst, err = text(name)
		errs = append(errs, err)
	}
	return row, errors.Join(errs...)
}
