// Package reconcile checks Breakwater's ledger against Google's bill: it
// reads Cloud Billing rows (a FOCUS 1.x CSV or the standard usage cost
// export as newline-delimited JSON, streamed row by row), keeps the
// Gemini API's, names each row's model from its description, and
// compares per day and model what the ledger counted with what Google
// billed.
//
// It is pure: the caller reads the ledger (usage rows and the ledger's
// day totals, Ledger) from whichever backend holds it and the bill from
// a file or BigQuery, and prints the Report. It knows no model table: the
// caller gives it the model names it knows.
package reconcile
