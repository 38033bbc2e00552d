package reconcile

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// exportReader generates a standard usage cost export of size bytes
// without holding it: a month of hourly rows, Gemini's and other
// services', each with the fields bq extract writes, rendered once and
// repeated until size.
type exportReader struct {
	size, done int64
	block      []byte // one month of rows
	at         int    // the next byte of block
}

func (r *exportReader) Read(p []byte) (int, error) {
	if r.block == nil {
		r.block = monthOfRows()
	}
	if r.done >= r.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && r.done < r.size {
		// Whole rows only: the file ends after a row.
		c := copy(p[n:min(len(p), n+int(r.size-r.done))], r.block[r.at:])
		n += c
		r.at = (r.at + c) % len(r.block)
		r.done += int64(c)
		if r.done >= r.size && r.at != 0 {
			r.size += int64(len(r.block) - r.at) // finish the row under way
		}
	}
	return n, nil
}

// monthOfRows is 720 hours of rows, two of every three the Gemini API's.
func monthOfRows() []byte {
	var b []byte
	for n := range 3 * 720 {
		start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(n%720) * time.Hour)
		service, sku := "Gemini API", "Gemini 3.5 Flash Lite Input Tokens"
		if n%3 == 0 {
			service, sku = "Compute Engine", "N2 Instance Core running in Americas"
		}
		b = fmt.Appendf(b, `{"billing_account_id":"01A2B3-C4D5E6-F7A8B9","service":{"id":"AEFD-7695-64FA","description":%q},"sku":{"id":"1A2B-3C4D-5E6F","description":%q},`+
			`"usage_start_time":%q,"usage_end_time":%q,"project":{"id":"ocr-prod","number":"123456789012","name":"ocr-prod","labels":[{"key":"team","value":"ocr"}]},`+
			`"labels":[],"system_labels":[],"location":{"location":"global"},"export_time":"2027-01-02 04:11:09.123456 UTC","cost":0.000123,"currency":"USD",`+
			`"currency_conversion_rate":1.0,"usage":{"amount":%d,"unit":"count","amount_in_pricing_units":0.001,"pricing_unit":"1M tokens"},"credits":[],"invoice":{"month":"202612"},"cost_type":"regular"}`+"\n",
			service, sku, start.Format("2006-01-02 15:04:05 UTC"), start.Add(time.Hour).Format("2006-01-02 15:04:05 UTC"), 1000+n%977)
	}
	return b
}

// TestLargeExportInBoundedMemory streams a 64 MB export (about 1 s, 13
// under the race detector; 32 MB with -short, any size with
// BREAKWATER_RECONCILE_BYTES: 500 MB took 4.9 MB more heap) through Read
// and a Bill, sampling the heap as it goes: what it holds must not grow
// with the file. Read whole into memory the file would take 64 MB at
// once; kept by the Bill, a row would add to what is still live once
// the file is read, which may be no more than a few bytes a row.
func TestLargeExportInBoundedMemory(t *testing.T) {
	size := int64(64 << 20)
	if v := os.Getenv("BREAKWATER_RECONCILE_BYTES"); v != "" {
		var err error
		if size, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	} else if testing.Short() {
		size = 32 << 20
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak, live := ms.HeapInuse, ms.HeapInuse, ms.HeapAlloc
	b := NewBill(NewMatcher(models, nil, DefaultServices), time.UTC, "", "")
	rows := 0
	started := time.Now()
	_, err := Read(&exportReader{size: size}, func(r Row) error {
		rows++
		if rows%20000 == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
		return b.Add(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(started)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	kept := int64(ms.HeapAlloc) - int64(live)
	runtime.KeepAlive(b)
	grew := int64(peak) - int64(base)
	t.Logf("%d MB, %d rows in %v (%.0f MB/s): heap in use %.1f MB at start, %.1f MB at peak (+%.1f MB); %d bytes more live after",
		size>>20, rows, took.Round(time.Millisecond), float64(size)/(1<<20)/took.Seconds(), float64(base)/(1<<20), float64(peak)/(1<<20), float64(grew)/(1<<20), kept)
	if grew > 32<<20 {
		t.Errorf("the heap grew by %.1f MB reading %d MB: the export is not streamed", float64(grew)/(1<<20), size>>20)
	}
	if kept > 256<<10+8*int64(rows) {
		t.Errorf("%d bytes (%.1f a row) are still live once %d rows are read: the bill keeps its rows", kept, float64(kept)/float64(rows), rows)
	}
	if b.Rows != int64(rows) || b.OtherService == 0 || len(b.days) != 30 {
		t.Errorf("rows %d (read %d), other services %d, days %d; want every row, 30 days", b.Rows, rows, b.OtherService, len(b.days))
	}
}
