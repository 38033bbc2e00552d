package api

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"breakwater/server/edge"
)

// TestAccessLog: with server.access_log each request of the public API
// gets one line with its method, route pattern, status, latency, user
// (once known), client IP and request id; without it, none.
func TestAccessLog(t *testing.T) {
	logs := &bytes.Buffer{}
	e := newEnv(t, envOptions{logTo: logs, cfg: func(c *edge.Config) { c.AccessLog = true }})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)
	okID := resp.Header.Get("X-Request-ID")
	resp, _ = e.post("", "image/png", pngBytes(t, 16, 16))
	deniedID := resp.Header.Get("X-Request-ID")
	do(t, mustRequest(t, http.MethodGet, e.http.URL+"/no/such/secret-path", ""))

	lines := regexp.MustCompile(`(?m)^.*msg=request .*$`).FindAllString(logs.String(), -1)
	if len(lines) != 3 {
		t.Fatalf("%d access log lines, want 3:\n%s", len(lines), logs.String())
	}
	for i, want := range []string{
		`method=POST route=/v1/ocr status=200 latency=\S+ ip=127\.0\.0\.1 request_id=` + regexp.QuoteMeta(okID) + ` user=alice$`,
		`method=POST route=/v1/ocr status=401 latency=\S+ ip=127\.0\.0\.1 request_id=` + regexp.QuoteMeta(deniedID) + `$`,
		`method=GET route=unmatched status=404 latency=\S+ ip=127\.0\.0\.1 request_id=\S+$`,
	} {
		if !regexp.MustCompile(`component=access ` + want).MatchString(lines[i]) {
			t.Errorf("line %d:\n%s\nwant it to match %s", i, lines[i], want)
		}
	}
	if strings.Contains(logs.String(), "secret-path") {
		t.Error("the raw path is in the log")
	}

	quiet := &bytes.Buffer{}
	e = newEnv(t, envOptions{logTo: quiet})
	e.post(e.key, "image/png", pngBytes(t, 16, 16))
	if strings.Contains(quiet.String(), "msg=request ") {
		t.Errorf("access log without server.access_log:\n%s", quiet.String())
	}
}
