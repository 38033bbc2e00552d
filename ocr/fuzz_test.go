package ocr

import (
	"regexp"
	"testing"
	"unicode/utf8"
)

func FuzzInspect(f *testing.F) {
	f.Add(encodePNG(f, 3, 2), "image/png", int64(1<<20))
	f.Add(encodeJPEG(f, 5, 4), "", int64(1<<20))
	f.Add(readTestdata(f, "tiny-lossless.webp"), "image/webp", int64(1<<20))
	f.Add(readTestdata(f, "tiny-lossy.webp"), "image/webp", int64(1<<20))
	f.Add(webpVP8X(64, 64, 0), "", int64(1<<20))
	f.Add(pngHeader(100000, 100000), "image/png", int64(50_000_000))
	f.Add(encodeGIF(f), "image/gif", int64(1<<20))
	f.Add([]byte("\xff\xd8\xff\xe0"), "image/jpg", int64(-1))
	f.Fuzz(func(t *testing.T, data []byte, declared string, maxPixels int64) {
		const maxSide = 8192
		agreesWithDecodeConfig(t, data) // the in-place PNG size, where it answers, is png.DecodeConfig's
		img, err := Inspect(data, declared, Limits{MaxPixels: maxPixels, MaxSide: maxSide})
		if err != nil {
			if err != ErrUnsupportedType && err != ErrUndecodable && err != ErrTooManyPixels {
				t.Fatalf("Inspect() error = %v, not a sentinel", err)
			}
			return
		}
		switch img.MIME {
		case MIMEPNG, MIMEJPEG, MIMEWebP:
		default:
			t.Fatalf("MIME = %q", img.MIME)
		}
		if img.Width <= 0 || img.Height <= 0 {
			t.Fatalf("size %d×%d", img.Width, img.Height)
		}
		if maxPixels <= 0 || int64(img.Width) > maxPixels/int64(img.Height) || img.Width > maxSide || img.Height > maxSide {
			t.Fatalf("%d×%d passed a limit of %d pixels, %d a side", img.Width, img.Height, maxPixels, maxSide)
		}
	})
}

func FuzzParseOutput(f *testing.F) {
	for _, s := range []string{
		`{"serials":["SN-12345"," AB12 ","x"]}`,
		`{"serials":[]}`,
		`{"serials":[1, true, null, {"a":[1]}, "\ud800"]}`,
		`{"serials":"SN"}`,
		`["SN-12345"]`,
		"```json\n{}\n```",
		`{"serials":["` + string(make([]byte, 100)) + `"]}`,
		candidate(`{"serials":["SN-12345"]}`, "STOP"),
		candidate(`{"serials":["SN-`, "MAX_TOKENS"),
		`{"promptFeedback":{"blockReason":"OTHER"}}`,
	} {
		f.Add(s)
	}
	pattern := regexp.MustCompile(DefaultSerialPattern)
	f.Fuzz(func(t *testing.T, text string) {
		serials, rejected, err := parseOutput(text, pattern)
		checkOutput(t, serials, rejected, err, pattern)

		// The same bytes as a whole response body.
		res, err := parseResponse([]byte(text), 200, pattern, DefaultModel)
		if err == nil {
			checkOutput(t, res.Serials, res.Rejected, nil, pattern)
		} else if _, ok := err.(*UpstreamError); !ok {
			t.Fatalf("parseResponse error %T, want *UpstreamError", err)
		}
		if res.Model == "" || !utf8.ValidString(res.Model) || len(res.Model) > maxModelBytes {
			t.Fatalf("Model = %q", res.Model)
		}
		u := res.Usage
		if u.PromptTokens < 0 || u.CandidatesTokens < 0 || u.ThoughtsTokens < 0 {
			t.Fatalf("negative usage %+v", u)
		}
	})
}

func checkOutput(t *testing.T, serials, rejected []string, err error, pattern *regexp.Regexp) {
	t.Helper()
	if err != nil {
		if serials != nil || rejected != nil {
			t.Fatalf("error %v with output %q %q", err, serials, rejected)
		}
		return
	}
	if serials == nil || rejected == nil {
		t.Fatalf("nil slices on success")
	}
	if len(serials) > maxSerials || len(rejected) > maxRejected {
		t.Fatalf("%d serials, %d rejected", len(serials), len(rejected))
	}
	seen := map[string]bool{}
	for _, s := range serials {
		if !pattern.MatchString(s) || seen[s] {
			t.Fatalf("serial %q bad or repeated", s)
		}
		seen[s] = true
	}
	for _, r := range rejected {
		if r == "" || len(r) > maxRejectedBytes || !utf8.ValidString(r) {
			t.Fatalf("rejected entry %q", r)
		}
	}
}
