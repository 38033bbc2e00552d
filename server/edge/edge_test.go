package edge

import (
	"bufio"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/server/keys"
)

// testEdge is an Edge of cfg's changes to the defaults, with a public
// listener served the way `serve` does (through HTTPServer, with its
// timeouts, header cap and connection cap): GET /healthz, and at POST
// /v1/ocr an upload read to its end under the transport's bounds, its
// user the bearer token (no key is checked here).
type testEdge struct {
	*Edge
	addr string
	lim  *connLimiter
}

func newTestEdge(t *testing.T, cfg func(*Config)) *testEdge {
	t.Helper()
	c := Config{}
	if cfg != nil {
		cfg(&c)
	}
	e, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ec := e.NewEcho(true)
	ec.GET("/healthz", HandleHealth)
	ec.HEAD("/healthz", HandleHealth)
	ec.POST("/v1/ocr", Chain(e.readUpload, LimitBody(e.cfg.MaxImageBytes), e.BoundUploads))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs, wrapped := e.HTTPServer(ln, ec)
	go hs.Serve(wrapped)
	t.Cleanup(func() { hs.Close() })
	return &testEdge{Edge: e, addr: ln.Addr().String(), lim: wrapped.(*connLimiter)}
}

// readUpload takes the uploader's in-flight slot and reads the body under
// its lease.
func (e *Edge) readUpload(c echo.Context) error {
	token, _ := Bearer(c.Request().Header.Get(echo.HeaderAuthorization))
	mem, err := e.Enter(keys.Identity{UserID: token})
	if err != nil {
		return err
	}
	defer mem.Close()
	if _, err := io.Copy(io.Discard, Arrivals(c.Request().Body, mem, e.cfg.MaxImageBytes)); err != nil {
		return ErrBadBody
	}
	return c.NoContent(http.StatusNoContent)
}

// metric reads one series' value as GET /metrics serves it.
func metric(t *testing.T, e *testEdge, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("metric %s missing", name)
	return ""
}

// upload is one raw POST /v1/ocr on its own connection, written by hand
// so that it can stop before its end.
type upload struct {
	conn net.Conn
	resp chan error
}

// startUpload sends the head of a POST /v1/ocr with key, declaring
// length, then the first send bytes of body, and keeps the connection
// open without sending more. Whether an answer came is on u.resp.
func startUpload(t *testing.T, addr, key string, length int64, body []byte, send int) *upload {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	u := &upload{conn: conn, resp: make(chan error, 1)}
	head := "POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nAuthorization: Bearer " + key + "\r\n" +
		"Content-Length: " + strconv.FormatInt(length, 10) + "\r\n\r\n"
	go func() {
		if _, err := io.WriteString(conn, head); err != nil {
			return
		}
		_, _ = conn.Write(body[:send]) // a refused upload's connection closes under it
	}()
	go func() {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			resp.Body.Close()
		}
		u.resp <- err
	}()
	return u
}

// answer waits for u's answer.
func (u *upload) answer(t *testing.T) {
	t.Helper()
	if err := <-u.resp; err != nil {
		t.Fatalf("no answer: %v", err)
	}
}

// waitFor polls cond, which watches the server's own state, until it
// holds or 5 seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}
