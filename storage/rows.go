package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"breakwater/budget"
)

// Binary rows: usage rows here, stored answers in answers.go, statistics
// events in events.go.
//
// Usage rows. Since schema version 4 a row is written in a compact binary
// form; rows written before are JSON and are still read as they are (no
// migration rewrites them). The binary form, after its format byte:
//
//	UserID, KeyID, RequestID, Model, Outcome: uvarint length + bytes each
//	Time (UnixNano), Bytes, PromptTokens, CandidatesTokens,
//	ThoughtsTokens, CostMicroUSD, LatencyMS: varint each
//
// A JSON row starts with '{', so the first byte tells the two apart. The
// binary row is about a third of the JSON one: the writer puts fewer
// pages per transaction and the file grows more slowly.
const usageRowV1 = 0x01

// errStoredRow means a stored binary row cannot be decoded.
var errStoredRow = errors.New("malformed row")

// appendUsageRow appends r's binary row to b.
func appendUsageRow(b []byte, r budget.UsageRecord) []byte {
	b = append(b, usageRowV1)
	for _, s := range [...]string{r.UserID, r.KeyID, r.RequestID, r.Model, r.Outcome} {
		b = appendText(b, s)
	}
	for _, v := range [...]int64{r.Time.UnixNano(), r.Bytes, int64(r.PromptTokens), int64(r.CandidatesTokens),
		int64(r.ThoughtsTokens), r.CostMicroUSD, r.LatencyMS} {
		b = binary.AppendVarint(b, v)
	}
	return b
}

// decodeUsageRow decodes a usage row of either form.
func decodeUsageRow(row []byte) (budget.UsageRecord, error) {
	return decodeRow(row, usageRowV1, func(d *rowDecoder, r *budget.UsageRecord) {
		r.UserID, r.KeyID, r.RequestID, r.Model, r.Outcome = d.string(), d.string(), d.string(), d.string(), d.string()
		r.Time = time.Unix(0, d.varint()).UTC()
		r.Bytes = d.varint()
		r.PromptTokens, r.CandidatesTokens, r.ThoughtsTokens = d.int(), d.int(), d.int()
		r.CostMicroUSD, r.LatencyMS = d.varint(), d.varint()
	})
}

// decodeRow decodes a stored row of either form: JSON, as rows were
// written before their binary form (a JSON row starts with '{'), or the
// binary form of format byte version, whose fields fields reads in order
// into v. Bytes left after the last field are an error.
func decodeRow[T any](row []byte, version byte, fields func(d *rowDecoder, v *T)) (T, error) {
	var v, zero T
	if len(row) > 0 && row[0] == '{' {
		if err := json.Unmarshal(row, &v); err != nil {
			return zero, err
		}
		return v, nil
	}
	if len(row) == 0 || row[0] != version {
		return zero, fmt.Errorf("%w: unknown form", errStoredRow)
	}
	d := rowDecoder{rest: row[1:]}
	fields(&d, &v)
	if err := d.end(); err != nil {
		return zero, err
	}
	return v, nil
}

// appendText appends s with its length before it (a uvarint).
func appendText[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// rowDecoder reads the fields of a binary row in order; after the first
// error every read returns a zero value and err keeps that error.
type rowDecoder struct {
	rest []byte
	err  error
}

// fail records a malformed field, unless an error is already recorded.
func (d *rowDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errStoredRow, fmt.Sprintf(format, args...))
	}
}

// end returns the first error, or one if bytes are left after the last
// field.
func (d *rowDecoder) end() error {
	if d.err == nil && len(d.rest) > 0 {
		d.fail("%d bytes after the last field", len(d.rest))
	}
	return d.err
}

func (d *rowDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.rest)
	if n <= 0 || n != uvarintLen(v) {
		d.fail("truncated or padded number")
		return 0
	}
	d.rest = d.rest[n:]
	return v
}

// uvarintLen is the length of v's shortest uvarint: the only one a
// decoder accepts, so that a row has one encoding.
func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return len(binary.AppendUvarint(b[:0], v))
}

// fixed returns the next n bytes (a copy), or nil if fewer are left.
func (d *rowDecoder) fixed(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.rest) < n {
		d.fail("truncated field")
		return nil
	}
	b := bytes.Clone(d.rest[:n])
	d.rest = d.rest[n:]
	return b
}

// strings reads a uvarint count and that many strings; nil for none.
func (d *rowDecoder) strings() []string {
	n := d.uvarint()
	if n > uint64(len(d.rest)) { // each string takes at least a byte
		d.fail("%d strings in %d bytes", n, len(d.rest))
		return nil
	}
	var list []string
	for i := uint64(0); i < n && d.err == nil; i++ {
		list = append(list, d.string())
	}
	if d.err != nil {
		return nil
	}
	return list
}

func (d *rowDecoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	u := d.uvarint() // zig-zag, as binary.AppendVarint writes it
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

// int reads a varint that must fit an int.
func (d *rowDecoder) int() int {
	v := d.varint()
	if int64(int(v)) != v {
		d.fail("count %d out of range", v)
		return 0
	}
	return int(v)
}

func (d *rowDecoder) string() string {
	if d.err != nil {
		return ""
	}
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.rest)) {
		d.fail("truncated text")
		return ""
	}
	s := string(d.rest[:n])
	d.rest = d.rest[n:]
	return s
}
