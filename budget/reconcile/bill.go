package reconcile

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Shape is the kind of billing file a bill is.
type Shape string

// The shapes Read knows.
const (
	// ShapeFOCUS is a FOCUS 1.x CSV (FinOps Open Cost and Usage
	// Specification), as Cloud Billing's FOCUS export gives it.
	ShapeFOCUS Shape = "FOCUS 1.x CSV"
	// ShapeBigQuery is the standard usage cost export to BigQuery, as
	// newline-delimited JSON (what bq extract writes).
	ShapeBigQuery Shape = "BigQuery standard usage cost export (NDJSON)"
)

// Row is one billing row, whichever shape it came in.
type Row struct {
	Line        int       // the file's line it starts on (1 is the first)
	Start, End  time.Time // the charge (usage) period
	CostMicro   int64     // BilledCost / cost, in millionths of Currency
	Currency    string
	Service     string
	Description string // ChargeDescription / sku.description
	Quantity    float64
	HasQuantity bool
	Unit        string
	// CreditsMicro is the sum of the row's credits (BigQuery's credits
	// amounts, negative), in millionths of Currency; FOCUS gives credits
	// as rows of their own (ChargeCategory "Credit", a negative cost).
	CreditsMicro int64
	// Category is FOCUS's ChargeCategory ("Usage", "Credit", ...) when
	// the file has the column; BigQuery rows leave it empty.
	Category string
}

// InputError is a bill that cannot be read: its line (0 for the file as
// a whole) and what is wrong.
type InputError struct {
	Line int
	Err  error
}

func (e *InputError) Error() string {
	if e.Line == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("line %d: %v", e.Line, e.Err)
}

func (e *InputError) Unwrap() error { return e.Err }

// ErrEmpty is a bill with no rows at all.
var ErrEmpty = errors.New("the bill is empty: export a day or more of Cloud Billing data (FOCUS CSV or BigQuery NDJSON)")

// ErrShape is a file of neither shape.
var ErrShape = errors.New("the bill is neither a FOCUS 1.x CSV (a header with ChargePeriodStart, BilledCost, ...) nor the BigQuery usage cost export as NDJSON (one JSON object a line)")

// maxLine bounds one NDJSON line: a row with many labels is a few
// kilobytes; a line beyond this is no billing row.
const maxLine = 4 << 20

// Read reads the bill in r row by row, calling fn with each: memory stays
// bounded whatever the file's size. It finds the shape from the first
// character that is not white space: "{" is NDJSON, anything else a CSV
// header. An error that is the file's is an *InputError naming its line;
// fn's error is returned as it is.
func Read(r io.Reader, fn func(Row) error) (Shape, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := firstByte(br)
	switch {
	case errors.Is(err, io.EOF):
		return "", &InputError{Err: ErrEmpty}
	case err != nil:
		return "", err
	case first == '{':
		return ShapeBigQuery, readNDJSON(br, fn)
	case first == '[':
		return "", &InputError{Line: 1, Err: fmt.Errorf("%w: a JSON array; write one object a line (bq extract --destination_format NEWLINE_DELIMITED_JSON)", ErrShape)}
	}
	return ShapeFOCUS, readFOCUS(br, fn)
}

// firstByte skips a UTF-8 byte order mark and leading white space, and
// returns the next byte without consuming it.
func firstByte(br *bufio.Reader) (byte, error) {
	if b, err := br.Peek(3); err == nil && bytes.Equal(b, []byte{0xEF, 0xBB, 0xBF}) {
		br.Discard(3)
	}
	for {
		b, err := br.Peek(1)
		if err != nil {
			return 0, err
		}
		if !strings.ContainsRune(" \t\r\n", rune(b[0])) {
			return b[0], nil
		}
		br.Discard(1)
	}
}

// micro is an amount in millionths, rounded to the nearest.
func micro(v float64) int64 { return int64(math.Round(v * 1e6)) }

// timeLayouts are the timestamps the two shapes write: FOCUS's ISO 8601
// in UTC, bq extract's "2026-12-01 08:00:00 UTC", and RFC 3339 with any
// offset.
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999 MST", "2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999", "2006-01-02"}

// parseTime reads a charge period's bound; a time without a zone is UTC.
func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (want ISO 8601, such as 2026-12-01T08:00:00Z)", s)
}
