package api

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"breakwater/ocr"
)

// reflectAnswerBody is the body of a successful read as encoding/json
// makes it: what answerBody writes by hand.
func reflectAnswerBody(t testing.TB, res ocr.Result, quota, used int64) []byte {
	t.Helper()
	b, err := json.Marshal(ocrResponse{
		Serials: nonNil(res.Serials), Rejected: nonNil(res.Rejected),
		Quota: quotaResponse{Limit: quota, Used: used, Remaining: max(quota-used, 0)},
		Model: res.Model, Simulated: res.Simulated,
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestAnswerBodyIsJSON: the hand-written answer is byte for byte what
// encoding/json makes of ocrResponse, escapes included.
func TestAnswerBodyIsJSON(t *testing.T) {
	for _, tc := range []struct {
		name        string
		res         ocr.Result
		quota, used int64
	}{
		{"nothing read", ocr.Result{}, 100, 1},
		{"empty lists", ocr.Result{Serials: []string{}, Rejected: []string{}}, 100, 100},
		{"serials", ocr.Result{Serials: []string{"SN-0001", "AB12 CD34"}, Rejected: []string{"??"}}, 1000, 7},
		{"simulated", ocr.Result{Serials: []string{"X"}, Simulated: true}, 10, 3},
		{"model", ocr.Result{Serials: []string{"X"}, Model: "gemini-2.5-flash-lite"}, 10, 3},
		{"model and simulated", ocr.Result{Model: "a\"<b>\u2028", Simulated: true}, 10, 3},
		{"over the quota", ocr.Result{Serials: []string{"X"}}, 10, 12},
		{"large figures", ocr.Result{}, math.MaxInt64, math.MinInt64 + 1},
		{"html", ocr.Result{Serials: []string{"<script>&amp;</script>"}}, 1, 0},
		{"quotes and backslashes", ocr.Result{Rejected: []string{`a"b\c`, `\"`, `"`}}, 1, 0},
		{"control characters", ocr.Result{Rejected: []string{"\x00\x01\b\f\n\r\t\x1f\x7f"}}, 1, 0},
		{"unicode", ocr.Result{Serials: []string{"é Ω 漢字 🙂"}}, 1, 0},
		{"line separators", ocr.Result{Serials: []string{"a\u2028b\u2029c"}}, 1, 0},
		{"invalid utf-8", ocr.Result{Serials: []string{"\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80z"}}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := answerBody(tc.res, tc.quota, tc.used), reflectAnswerBody(t, tc.res, tc.quota, tc.used)
			if !bytes.Equal(got, want) {
				t.Errorf("answerBody:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// FuzzAnswerBody holds answerBody to encoding/json's bytes for any
// strings.
func FuzzAnswerBody(f *testing.F) {
	f.Add("SN-1", "<&>", int64(100), int64(1), false)
	f.Add("\u2028\xff\"\\", "\x00", int64(0), int64(5), true)
	f.Fuzz(func(t *testing.T, serial, rejected string, quota, used int64, simulated bool) {
		res := ocr.Result{Serials: []string{serial, rejected + serial}, Rejected: []string{rejected}, Simulated: simulated}
		if got, want := answerBody(res, quota, used), reflectAnswerBody(t, res, quota, used); !bytes.Equal(got, want) {
			t.Errorf("answerBody:\n got %q\nwant %q", got, want)
		}
	})
}

// TestAnswerBodyAllocations: the answer is made in one buffer (encoding/json
// took two, and its reflection most of the time).
func TestAnswerBodyAllocations(t *testing.T) {
	res := ocr.Result{Serials: []string{"SN-0001", "SN-0002"}, Rejected: []string{"S<0003"}, Model: "gemini-3.5-flash-lite", Simulated: true}
	if got := testing.AllocsPerRun(100, func() { answerBody(res, 1000, 10) }); got > 1 {
		t.Errorf("%v allocations per answer, want at most 1", got)
	}
}
