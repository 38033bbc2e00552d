package api

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"testing"

	"breakwater/server/edge"
)

// FuzzReadImage feeds the upload reader a body as a plain upload or as a
// multipart form, with a declared or an unknown length, and checks it
// against an independent reading of the same bytes:
//   - it never returns more than max bytes, nor an empty image, and never
//     holds more than max bytes of body memory;
//   - a plain body is returned whole if it is 1 to max bytes, and refused
//     as too large beyond;
//   - a form is read only if it has at most maxParts parts: then the first
//     "image" part is returned byte for byte with its Content-Type;
//     a form with more parts is refused.
func FuzzReadImage(f *testing.F) {
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00")
	form := func(fields ...string) []byte {
		var b bytes.Buffer
		w := multipart.NewWriter(&b)
		_ = w.SetBoundary("XyZ")
		for i := 0; i+1 < len(fields); i += 2 {
			fw, _ := w.CreateFormFile(fields[i], "scan.png")
			_, _ = fw.Write([]byte(fields[i+1]))
		}
		_ = w.Close()
		return b.Bytes()
	}
	f.Add(png, false, "", true, uint16(1024), uint8(8))
	f.Add(png, false, "", false, uint16(10), uint8(8))
	f.Add(form("image", string(png)), true, "XyZ", true, uint16(1024), uint8(8))
	f.Add(form("note", "hello", "image", string(png), "more", "x"), true, "XyZ", false, uint16(1024), uint8(3))
	f.Add(form("a", "", "b", "", "c", "", "image", string(png)), true, "XyZ", true, uint16(1024), uint8(3))
	f.Add(form("image", string(png), "a", "", "b", ""), true, "XyZ", true, uint16(1024), uint8(2))
	f.Add(form("image", ""), true, "XyZ", true, uint16(1024), uint8(8))
	f.Add([]byte("--XyZ\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nabc"), true, "XyZ", false, uint16(1024), uint8(8))
	f.Add(form("image", string(png)), true, "", true, uint16(1024), uint8(8))
	f.Fuzz(func(t *testing.T, body []byte, multi bool, boundary string, declared bool, max16 uint16, parts8 uint8) {
		max, maxParts := int64(max16%4096)+1, int(parts8%16)+1
		r, _ := http.NewRequest(http.MethodPost, "/v1/ocr", bytes.NewReader(body))
		ct := "image/png"
		if multi {
			ct = "multipart/form-data; boundary=\"" + boundary + "\""
		}
		r.Header.Set("Content-Type", ct)
		r.ContentLength = -1
		if declared {
			r.ContentLength = int64(len(body))
		}
		mem := edge.NewLease(1 << 30)
		data, gotType, err := readImage(r, max, maxParts, mem)
		if mem.Held() > max {
			t.Fatalf("held %d bytes of body memory for max %d", mem.Held(), max)
		}
		if err == nil && (len(data) == 0 || int64(len(data)) > max) {
			t.Fatalf("returned %d bytes for max %d", len(data), max)
		}
		// A Content-Type that does not parse is a plain upload's.
		mt, params, _ := mime.ParseMediaType(ct)
		if mt != "multipart/form-data" || params["boundary"] == "" {
			checkPlain(t, body, data, gotType, ct, err, mt == "multipart/form-data", max)
			return
		}
		want, wantType, count, ok := firstImagePart(body, params["boundary"], maxParts)
		switch {
		case count > maxParts:
			if err == nil {
				t.Fatalf("a form of more than %d parts read", maxParts)
			}
		case err != nil:
			// A refusal is right only if the independent reading found
			// no whole image of 1 to max bytes.
			if ok && len(want) > 0 && int64(len(want)) <= max {
				t.Fatalf("form of %d parts with a %d-byte image (max %d) refused: %v", count, len(want), max, err)
			}
		case !ok || !bytes.Equal(data, want) || gotType != wantType:
			t.Fatalf("read %d bytes %q, the form holds %d bytes %q (ok %v)", len(data), gotType, len(want), wantType, ok)
		}
	})
}

func checkPlain(t *testing.T, body, data []byte, gotType, ct string, err error, multi bool, max int64) {
	t.Helper()
	if multi {
		// A form without a boundary has no image.
		if err != errMissingImage {
			t.Fatalf("form without a boundary: error %v", err)
		}
		return
	}
	switch {
	case len(body) == 0:
		if err != errMissingImage {
			t.Fatalf("empty body: error %v", err)
		}
	case int64(len(body)) > max:
		if err != edge.ErrTooLarge {
			t.Fatalf("%d bytes for max %d: error %v", len(body), max, err)
		}
	case err != nil || !bytes.Equal(data, body) || gotType != ct:
		t.Fatalf("%d-byte body read as %d bytes %q, error %v", len(body), len(data), gotType, err)
	}
}

// firstImagePart reads the form the way the standard library does, with
// no limits: the first "image" part's content and Content-Type, whether
// that part was read whole, and the number of parts before the form ends
// or breaks (counting at most maxParts+1).
func firstImagePart(body []byte, boundary string, maxParts int) (data []byte, typ string, count int, ok bool) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	found := false
	for count <= maxParts {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		count++
		if found || p.FormName() != "image" {
			continue
		}
		found = true
		b, err := io.ReadAll(p)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, "", count, false
		}
		data, typ, ok = b, p.Header.Get("Content-Type"), true
	}
	return data, typ, count, ok
}
