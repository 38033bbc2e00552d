package reconcile

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Defaults of Config.
const (
	// DefaultMaxDrift is the largest share by which a day's bill may
	// differ from its ledger before reconcile reports it (exit status 3,
	// the ledger_drift alert).
	DefaultMaxDrift = 0.05
	// DefaultBigQueryEndpoint is BigQuery's REST API.
	DefaultBigQueryEndpoint = "https://bigquery.googleapis.com/bigquery/v2"
)

// DefaultServices are the Cloud Billing service names of the Gemini API:
// the name Google AI Studio's keys bill under, and the API's name in the
// console.
var DefaultServices = []string{"Gemini API", "Generative Language API"}

// SKU names the model of a billing row whose description names no model
// Breakwater knows: a row whose description contains Match (case and
// spaces or hyphens aside) is Model's.
type SKU struct {
	Match string `koanf:"match"`
	Model string `koanf:"model"`
}

// Config is the [reconcile] section of config.toml.
type Config struct {
	// MaxDrift is the largest share by which a day's billed cost may
	// differ from its counted cost (billed ÷ counted − 1, either way).
	// Default 0.05; above 0.
	MaxDrift float64 `koanf:"max_drift"`
	// Services are the billing rows' service names (ServiceName,
	// service.description) that are the Gemini API, matched without
	// regard to case. Default DefaultServices.
	Services []string `koanf:"services"`
	// SKU names the model of rows the model names do not match.
	SKU []SKU `koanf:"sku"`
	// BigQueryTable is the standard usage cost export's table,
	// "project.dataset.table": with it the daily run reconciles the last
	// complete days. Empty: off.
	BigQueryTable string `koanf:"bigquery_table"`
	// BigQueryEndpoint is BigQuery's REST API (change it only for a test
	// double or a proxy). Default DefaultBigQueryEndpoint.
	BigQueryEndpoint string `koanf:"bigquery_endpoint"`
}

// DefaultConfig is the section of a config.toml that leaves every key
// out; decode the file over it, so that an explicit 0 stays 0 and is
// refused.
func DefaultConfig() Config { return Config{MaxDrift: DefaultMaxDrift} }

// WithDefaults fills the zero fields that have defaults.
func (c Config) WithDefaults() Config {
	if len(c.Services) == 0 {
		c.Services = DefaultServices
	}
	if c.BigQueryEndpoint == "" {
		c.BigQueryEndpoint = DefaultBigQueryEndpoint
	}
	return c
}

// tableName is a BigQuery table as "project.dataset.table": a project id
// (letters, digits, hyphens; a domain-scoped one with a colon), a dataset
// and a table of letters, digits and underscores.
var tableName = regexp.MustCompile(`^[a-z][a-z0-9.:-]{4,}[a-z0-9]\.[A-Za-z0-9_]+\.[A-Za-z0-9_$-]+$`)

// Validate checks c; known reports whether a model name is one the
// service knows (the table's families and the overrides' names), for
// the entries of SKU. Errors name the key.
func (c Config) Validate(known func(model string) bool) error {
	var errs []error
	if !(c.MaxDrift > 0 && c.MaxDrift <= 10) {
		errs = append(errs, fmt.Errorf("reconcile.max_drift: %v: want a share above 0 and at most 10, such as 0.05 (5%%)", c.MaxDrift))
	}
	for i, s := range c.Services {
		if strings.TrimSpace(s) == "" {
			errs = append(errs, fmt.Errorf("reconcile.services[%d]: empty: name a Cloud Billing service, such as %q", i, DefaultServices[0]))
		}
	}
	for i, s := range c.SKU {
		if strings.TrimSpace(s.Match) == "" {
			errs = append(errs, fmt.Errorf("reconcile.sku[%d].match: required: a part of the billing row's description, such as \"Gemini 3.5 Flash Lite\"", i))
		}
		if s.Model == "" {
			errs = append(errs, fmt.Errorf("reconcile.sku[%d].model: required: the model whose cost the row is", i))
		} else if known != nil && !known(s.Model) {
			errs = append(errs, fmt.Errorf("reconcile.sku[%d].model: %q is no model of the table or of [[ocr.model_overrides]]", i, s.Model))
		}
	}
	if c.BigQueryTable != "" && !tableName.MatchString(c.BigQueryTable) {
		errs = append(errs, fmt.Errorf("reconcile.bigquery_table: %q: want \"project.dataset.table\", the standard usage cost export's table (gcp_billing_export_v1_...)", c.BigQueryTable))
	}
	if e := c.BigQueryEndpoint; e != "" && !strings.HasPrefix(e, "https://") && !loopbackHTTP(e) {
		errs = append(errs, fmt.Errorf("reconcile.bigquery_endpoint: %q: want an https:// URL (plain http only to 127.0.0.1 or localhost: "+
			"the service account's token goes with every request); leave it out for BigQuery's own", e))
	}
	return errors.Join(errs...)
}

// loopbackHTTP reports whether u is a plain http URL of this machine.
func loopbackHTTP(u string) bool {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme != "http" {
		return false
	}
	h := parsed.Hostname()
	return h == "localhost" || h == "127.0.0.1" || h == "::1"
}
