package ocr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// testPicture is a small image with some structure in it.
func testPicture(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for x := range w {
		for y := range h {
			img.Set(x, y, color.NRGBA{uint8(40 * x), uint8(60 * y), 200, 255})
		}
	}
	return img
}

func encodePNG(tb testing.TB, w, h int) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, testPicture(w, h)); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func encodeJPEG(tb testing.TB, w, h int) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, testPicture(w, h), nil); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func encodeGIF(tb testing.TB) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := gif.Encode(&buf, testPicture(3, 2), nil); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func readTestdata(tb testing.TB, name string) []byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// pngHeader is a PNG signature and a valid IHDR chunk claiming w×h pixels,
// with no image data after it.
func pngHeader(w, h uint32) []byte {
	ihdr := make([]byte, 0, 17)
	ihdr = append(ihdr, "IHDR"...)
	ihdr = binary.BigEndian.AppendUint32(ihdr, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // 8-bit RGBA, no interlace
	out := []byte("\x89PNG\r\n\x1a\n")
	out = binary.BigEndian.AppendUint32(out, 13)
	out = append(out, ihdr...)
	return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(ihdr))
}

// webpVP8X is an extended WebP header for a w×h canvas with the given flags.
func webpVP8X(w, h int, flags byte) []byte {
	chunk := []byte{flags, 0, 0, 0}
	for _, v := range []int{w - 1, h - 1} {
		chunk = append(chunk, byte(v), byte(v>>8), byte(v>>16))
	}
	out := []byte("RIFF")
	out = binary.LittleEndian.AppendUint32(out, uint32(4+8+len(chunk)))
	out = append(out, "WEBPVP8X"...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(chunk)))
	return append(out, chunk...)
}

func TestInspect(t *testing.T) {
	pngData := encodePNG(t, 3, 2)
	jpegData := encodeJPEG(t, 5, 4)
	lossless := readTestdata(t, "tiny-lossless.webp")
	lossy := readTestdata(t, "tiny-lossy.webp")
	const max = 1 << 20

	for _, tt := range []struct {
		name      string
		data      []byte
		declared  string
		maxPixels int64
		wantErr   error
		wantMIME  string
		wantW     int
		wantH     int
	}{
		{"png", pngData, "image/png", max, nil, MIMEPNG, 3, 2},
		{"png undeclared", pngData, "", max, nil, MIMEPNG, 3, 2},
		{"png octet-stream", pngData, "application/octet-stream", max, nil, MIMEPNG, 3, 2},
		{"png with parameters and case", pngData, "Image/PNG; name=label.png", max, nil, MIMEPNG, 3, 2},
		{"jpeg", jpegData, "image/jpeg", max, nil, MIMEJPEG, 5, 4},
		{"jpeg as image/jpg", jpegData, "image/jpg", max, nil, MIMEJPEG, 5, 4},
		{"webp lossless", lossless, "image/webp", max, nil, MIMEWebP, 3, 2},
		{"webp lossy", lossy, "", max, nil, MIMEWebP, 3, 2},
		{"webp extended still", webpVP8X(640, 480, 0), "image/webp", max, nil, MIMEWebP, 640, 480},
		{"exactly the pixel limit", pngData, "", 6, nil, MIMEPNG, 3, 2},

		{"png declared jpeg", pngData, "image/jpeg", max, ErrUnsupportedType, "", 0, 0},
		{"jpeg declared png", jpegData, "image/png", max, ErrUnsupportedType, "", 0, 0},
		{"webp declared png", lossless, "image/png", max, ErrUnsupportedType, "", 0, 0},
		{"unparsable declared", pngData, "image/png;;;=", max, ErrUnsupportedType, "", 0, 0},
		{"gif", encodeGIF(t), "image/gif", max, ErrUnsupportedType, "", 0, 0},
		{"gif undeclared", encodeGIF(t), "", max, ErrUnsupportedType, "", 0, 0},
		{"heic", []byte("\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic"), "image/heic", max, ErrUnsupportedType, "", 0, 0},
		{"avif", []byte("\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf"), "", max, ErrUnsupportedType, "", 0, 0},
		{"animated webp", webpVP8X(64, 64, 0x02), "image/webp", max, ErrUnsupportedType, "", 0, 0},
		{"riff but not webp", []byte("RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00"), "", max, ErrUnsupportedType, "", 0, 0},
		{"empty", nil, "", max, ErrUnsupportedType, "", 0, 0},
		{"text", []byte("hello, world"), "text/plain", max, ErrUnsupportedType, "", 0, 0},

		{"png truncated header", pngData[:20], "", max, ErrUndecodable, "", 0, 0},
		{"png signature only", pngData[:8], "", max, ErrUndecodable, "", 0, 0},
		{"png bad crc", append(pngHeader(3, 2)[:29:29], 0, 0, 0, 0), "", max, ErrUndecodable, "", 0, 0},
		{"png zero width", pngHeader(0, 10), "", max, ErrUndecodable, "", 0, 0},
		{"jpeg truncated", jpegData[:10], "", max, ErrUndecodable, "", 0, 0},
		{"jpeg magic only", []byte("\xff\xd8\xff"), "", max, ErrUndecodable, "", 0, 0},
		{"webp truncated", lossless[:20], "", max, ErrUndecodable, "", 0, 0},

		{"one pixel over", pngData, "", 5, ErrTooManyPixels, "", 0, 0},
		{"zero limit", pngData, "", 0, ErrTooManyPixels, "", 0, 0},
		{"100000x100000 header", pngHeader(100000, 100000), "image/png", 50_000_000, ErrTooManyPixels, "", 0, 0},
		{"2^20 square, one pixel over", pngHeader(1<<20, 1<<20), "", 1<<40 - 1, ErrTooManyPixels, "", 0, 0},
		{"2^20 square, at the limit", pngHeader(1<<20, 1<<20), "", 1 << 40, nil, MIMEPNG, 1 << 20, 1 << 20},
		{"big webp canvas", webpVP8X(10000, 10000, 0), "", 50_000_000, ErrTooManyPixels, "", 0, 0},
		{"png beyond the decoder's limits", pngHeader(1<<31-1, 1<<31-1), "", math.MaxInt64, ErrUndecodable, "", 0, 0},
		{"webp beyond the format's limits", webpVP8X(1<<24, 1<<24, 0), "", math.MaxInt64, ErrUndecodable, "", 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			img, err := Inspect(tt.data, tt.declared, Limits{MaxPixels: tt.maxPixels, MaxSide: math.MaxInt32})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Inspect() error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				if err != tt.wantErr {
					t.Errorf("error = %v, want the sentinel itself", err)
				}
				return
			}
			if img.MIME != tt.wantMIME || img.Width != tt.wantW || img.Height != tt.wantH {
				t.Errorf("Inspect() = %s %d×%d, want %s %d×%d", img.MIME, img.Width, img.Height, tt.wantMIME, tt.wantW, tt.wantH)
			}
			if len(img.Data) != len(tt.data) || &img.Data[0] != &tt.data[0] {
				t.Errorf("Image.Data is not the input")
			}
		})
	}
}

// TestInspectSideLimit: a long thin header has few pixels but many tiles,
// so the longer side is bounded too.
func TestInspectSideLimit(t *testing.T) {
	lim := Limits{MaxPixels: 40_000_000, MaxSide: 8192}
	for _, tt := range []struct {
		w, h uint32
		lim  Limits
		ok   bool
	}{
		{1, 8192, lim, true},
		{8192, 1, lim, true},
		{8192, 4882, lim, true}, // both limits nearly reached
		{1, 8193, lim, false},
		{8193, 1, lim, false},
		{1, 40_000_000, lim, false},         // 40 M pixels, but 52,084 tiles
		{3, 2, Limits{MaxPixels: 6}, false}, // MaxSide 0 refuses all
	} {
		_, err := Inspect(pngHeader(tt.w, tt.h), "image/png", tt.lim)
		if tt.ok && err != nil || !tt.ok && err != ErrTooManyPixels {
			t.Errorf("%d×%d with %+v: %v", tt.w, tt.h, tt.lim, err)
		}
	}
}

func TestInspectHugeHeaderAllocatesNothing(t *testing.T) {
	data := pngHeader(100000, 100000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := Inspect(data, "image/png", Limits{MaxPixels: 50_000_000, MaxSide: 8192}); err != ErrTooManyPixels {
			t.Fatalf("Inspect() = %v, want ErrTooManyPixels", err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("10 Inspect calls allocated %d bytes, want well under 1 MiB", got)
	}
}
