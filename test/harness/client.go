package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// Answer is what a client saw of one POST /v1/ocr.
type Answer struct {
	Status     int    // 0: no answer (connection refused, reset, timeout)
	Code       string // the problem's code, for an error
	RequestID  string // X-Request-ID
	RetryAfter int    // seconds, 0 if absent
	Err        error  // the transport error, or the body's
}

// Post sends img to addr's /v1/ocr with key. A status line is an answer
// even when the body that follows is cut off: for the tests a 200 counts
// as a result from its first byte.
func Post(ctx context.Context, client *http.Client, addr, key string, img []byte) Answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		return Answer{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	resp, err := client.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	a := Answer{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-ID")}
	a.RetryAfter, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		a.Err = err
		return a
	}
	if resp.StatusCode != http.StatusOK {
		var p struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(body, &p)
		a.Code = p.Code
	}
	return a
}
