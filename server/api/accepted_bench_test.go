package api

import (
	"net/http"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/storage"
)

// BenchmarkAccepted runs accepted reads one after another through the
// public handler, without sockets, so that allocs/op and B/op are the
// server's own (the writer's included) and can be followed from change to
// change. The database skips fsync here: ns/op is then CPU, not the disk
// (over real sockets and with fsync, bench/load measures the path whole).
//
//	go test -run '^$' -bench Accepted$ -benchmem ./server/api/
func BenchmarkAccepted(b *testing.B) {
	img := pngBytes(b, 64, 32)
	srv, secrets := newBenchServiceOn(b, limiter.Config{Rate: 100_000, Window: time.Second}, storage.Options{NoSync: true})
	h := srv.Handler()
	w := &discardWriter{h: http.Header{}}
	req, body := refusalRequest(img)
	req.Header["Authorization"] = []string{"Bearer " + secrets[0]}
	serveEach(b, h, w, req, body, img, http.StatusOK, nil)
}
