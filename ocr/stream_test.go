package ocr

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"testing/iotest"
)

// TestRequestBodyIsTheWireFormat checks that the streamed body is, byte
// for byte, json.Marshal of the request struct (inlineData.data in standard
// base64 with padding), whatever the image's length modulo 3 and however
// small the reads, and that each open starts afresh (the retry resends it).
func TestRequestBodyIsTheWireFormat(t *testing.T) {
	g, _, _ := newTestGemini(t, Config{}, "http://127.0.0.1:1")
	rnd := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.UintN(256))
		}
		return b
	}
	tests := []struct {
		name string
		img  Image
	}{
		{"one byte", Image{MIME: MIMEPNG, Data: random(1)}},
		{"two bytes", Image{MIME: MIMEJPEG, Data: random(2)}},
		{"three bytes", Image{MIME: MIMEWebP, Data: random(3)}},
		{"four bytes", Image{MIME: MIMEPNG, Data: random(4)}},
		{"test image", testImage},
		{"odd MIME type", Image{MIME: `image/x<&>"quoted"`, Data: random(1000)}},
		{"1 MiB + 1", Image{MIME: MIMEPNG, Data: random(1<<20 + 1)}},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte at a time", iotest.OneByteReader},
		{"half reads", iotest.HalfReader},
		{"five bytes at a time", func(r io.Reader) io.Reader { return &chunkReader{r: r, n: 5} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(g.request(g.primary, tt.img))
			if err != nil {
				t.Fatal(err)
			}
			body, err := g.body(g.primary, tt.img)
			if err != nil {
				t.Fatal(err)
			}
			if got := body.size(); got != int64(len(want)) {
				t.Errorf("size() = %d, want %d", got, len(want))
			}
			for _, rd := range readers {
				if rd.name != "whole" && len(tt.img.Data) > 4096 {
					continue // byte-wise reads of a megabyte prove nothing more
				}
				got, err := io.ReadAll(rd.wrap(body.open()))
				if err != nil {
					t.Fatalf("%s: %v", rd.name, err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s: body differs from json.Marshal of the request:\n got %.300s\nwant %.300s", rd.name, got, want)
				}
			}
		})
	}
}

// chunkReader reads at most n bytes at a time.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// TestReadStreamsLargeImage sends a 16 MiB image to a fake Gemini and
// checks that the request arrives whole, with its exact Content-Length,
// while building it allocated nothing near the image's 4/3 × 16 MiB
// base64: the body is encoded as it is written to the connection.
func TestReadStreamsLargeImage(t *testing.T) {
	img := Image{MIME: MIMEPNG, Data: make([]byte, 16<<20)}
	for i := range img.Data {
		img.Data[i] = byte(i * 7)
	}
	var want [sha256.Size]byte
	var wantLen int64
	{
		g, _, _ := newTestGemini(t, Config{}, "http://127.0.0.1:1")
		b, err := json.Marshal(g.request(g.primary, img))
		if err != nil {
			t.Fatal(err)
		}
		want, wantLen = sha256.Sum256(b), int64(len(b))
	}
	answer := reply{status: 200, file: "ok.json"}.bytes(t)
	var gotSum [sha256.Size]byte
	var gotLen, gotCL int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body) // hashed as it comes, never held
		if err != nil {
			t.Errorf("read request: %v", err)
		}
		copy(gotSum[:], h.Sum(nil))
		gotLen, gotCL = n, r.ContentLength
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	defer srv.Close()
	g, _, _ := newTestGemini(t, Config{}, srv.URL)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := g.Read(context.Background(), img, alwaysRetry); err != nil {
		t.Fatalf("Read: %v", err)
	}
	runtime.ReadMemStats(&after)

	if gotSum != want || gotLen != wantLen {
		t.Errorf("upstream got %d bytes (sha256 %x), want %d bytes of json.Marshal(request) (%x)", gotLen, gotSum[:6], wantLen, want[:6])
	}
	if gotCL != wantLen {
		t.Errorf("Content-Length %d, want %d (known in advance)", gotCL, wantLen)
	}
	if alloc, limit := after.TotalAlloc-before.TotalAlloc, uint64(len(img.Data)/8); alloc > limit {
		t.Errorf("Read allocated %d bytes for a %d-byte image, want at most %d: the base64 body was built in memory", alloc, len(img.Data), limit)
	}
}
