package reconcile

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The FOCUS columns Read needs (FOCUS 1.0 to 1.2 name them alike); the
// others are ignored. ChargeCategory is read when present.
var focusColumns = []string{"ChargePeriodStart", "ChargePeriodEnd", "BilledCost", "BillingCurrency", "ServiceName",
	"ChargeDescription", "ConsumedQuantity", "ConsumedUnit"}

// readFOCUS reads a FOCUS CSV: its header names the columns, in any
// order.
func readFOCUS(r io.Reader, fn func(Row) error) error {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return csvError(err, 1)
	}
	col := map[string]int{}
	for i, name := range header {
		col[strings.TrimSpace(name)] = i
	}
	var missing []string
	for _, name := range focusColumns {
		if _, ok := col[name]; !ok {
			missing = append(missing, name)
		}
	}
	switch {
	case len(missing) == len(focusColumns):
		return &InputError{Line: 1, Err: ErrShape}
	case len(missing) > 0:
		return &InputError{Line: 1, Err: fmt.Errorf("the FOCUS header lacks the column %s (it has %d columns: %s)",
			strings.Join(missing, ", "), len(header), strings.Join(header[:min(len(header), 12)], ","))}
	}
	category, hasCategory := col["ChargeCategory"]
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return csvError(err, line)
		}
		row, err := focusRow(rec, col)
		if err != nil {
			return &InputError{Line: line, Err: err}
		}
		row.Line = line
		if hasCategory {
			row.Category = rec[category]
		}
		if err := fn(row); err != nil {
			return err
		}
	}
}

// csvError is a CSV reader's error as an InputError with its line.
func csvError(err error, line int) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &InputError{Line: pe.StartLine, Err: pe.Err}
	}
	if errors.Is(err, io.EOF) {
		return &InputError{Err: ErrEmpty}
	}
	return &InputError{Line: line, Err: err}
}

// focusRow reads one record by column.
func focusRow(rec []string, col map[string]int) (Row, error) {
	get := func(name string) string { return strings.TrimSpace(rec[col[name]]) }
	var row Row
	var err error
	if row.Start, err = parseTime(get("ChargePeriodStart")); err != nil {
		return row, fmt.Errorf("ChargePeriodStart: %w", err)
	}
	if row.End, err = parseTime(get("ChargePeriodEnd")); err != nil {
		return row, fmt.Errorf("ChargePeriodEnd: %w", err)
	}
	cost, err := strconv.ParseFloat(get("BilledCost"), 64)
	if err != nil {
		return row, fmt.Errorf("BilledCost: %q is not a number", get("BilledCost"))
	}
	row.CostMicro = micro(cost)
	row.Currency, row.Service, row.Description = get("BillingCurrency"), get("ServiceName"), get("ChargeDescription")
	row.Unit = get("ConsumedUnit")
	if q := get("ConsumedQuantity"); q != "" {
		if row.Quantity, err = strconv.ParseFloat(q, 64); err != nil {
			return row, fmt.Errorf("ConsumedQuantity: %q is not a number", q)
		}
		row.HasQuantity = true
	}
	return row, nil
}
