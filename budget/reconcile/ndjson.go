package reconcile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// bqRow is a row of the standard usage cost export as bq extract writes
// it; the fields Read needs, each a pointer so that a missing one is
// told from a zero one. The other fields are ignored.
type bqRow struct {
	UsageStartTime *string  `json:"usage_start_time"`
	UsageEndTime   *string  `json:"usage_end_time"`
	Cost           *float64 `json:"cost"`
	Currency       *string  `json:"currency"`
	Service        *struct {
		Description *string `json:"description"`
	} `json:"service"`
	SKU *struct {
		Description *string `json:"description"`
	} `json:"sku"`
	Usage *struct {
		Amount *float64 `json:"amount"`
		Unit   *string  `json:"unit"`
	} `json:"usage"`
	Credits []struct {
		Amount float64 `json:"amount"`
	} `json:"credits"`
}

// missing names the first required field the row lacks, "" if none.
// usage.amount may be null (a row without usage, such as a tax).
func (b *bqRow) missing() string {
	switch {
	case b.UsageStartTime == nil:
		return "usage_start_time"
	case b.UsageEndTime == nil:
		return "usage_end_time"
	case b.Cost == nil:
		return "cost"
	case b.Currency == nil:
		return "currency"
	case b.Service == nil || b.Service.Description == nil:
		return "service.description"
	case b.SKU == nil || b.SKU.Description == nil:
		return "sku.description"
	case b.Usage == nil:
		return "usage.amount"
	}
	return ""
}

// readNDJSON reads the export one line at a time.
func readNDJSON(r io.Reader, fn func(Row) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var b bqRow
		if err := json.Unmarshal(text, &b); err != nil {
			return &InputError{Line: line, Err: fmt.Errorf("not a JSON object of the usage cost export: %v", err)}
		}
		if name := b.missing(); name != "" {
			return &InputError{Line: line, Err: fmt.Errorf("the row lacks the field %s of the usage cost export", name)}
		}
		row, err := b.row()
		if err != nil {
			return &InputError{Line: line, Err: err}
		}
		row.Line = line
		if err := fn(row); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &InputError{Line: line + 1, Err: fmt.Errorf("a line longer than %d bytes is no billing row", maxLine)}
		}
		return err
	}
	return nil
}

// row is b as a Row.
func (b *bqRow) row() (Row, error) {
	var row Row
	var err error
	if row.Start, err = parseTime(*b.UsageStartTime); err != nil {
		return row, fmt.Errorf("usage_start_time: %w", err)
	}
	if row.End, err = parseTime(*b.UsageEndTime); err != nil {
		return row, fmt.Errorf("usage_end_time: %w", err)
	}
	row.CostMicro = micro(*b.Cost)
	row.Currency = strings.TrimSpace(*b.Currency)
	row.Service, row.Description = *b.Service.Description, *b.SKU.Description
	if b.Usage.Amount != nil {
		row.Quantity, row.HasQuantity = *b.Usage.Amount, true
	}
	if b.Usage.Unit != nil {
		row.Unit = *b.Usage.Unit
	}
	for _, c := range b.Credits {
		row.CreditsMicro += micro(c.Amount)
	}
	return row, nil
}
