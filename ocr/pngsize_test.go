package ocr

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"image/png"
	"testing"
)

// agreesWithDecodeConfig fails t unless pngSize, where it answers, gives
// what png.DecodeConfig gives for data.
func agreesWithDecodeConfig(t *testing.T, data []byte) (fast bool) {
	t.Helper()
	w, h, ok := pngSize(data)
	if !ok {
		return false
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width != w || cfg.Height != h {
		t.Fatalf("pngSize(%x) = %d×%d; png.DecodeConfig = %d×%d, %v", data, w, h, cfg.Width, cfg.Height, err)
	}
	return true
}

// TestPNGSizeEncoded: PNGs as Go's encoder writes them, of every colour
// model: those without a palette are read in place, paletted ones go to
// png.DecodeConfig.
func TestPNGSizeEncoded(t *testing.T) {
	rect := image.Rect(0, 0, 7, 3)
	for name, tt := range map[string]struct {
		img  image.Image
		fast bool
	}{
		"gray":      {image.NewGray(rect), true},
		"gray16":    {image.NewGray16(rect), true},
		"rgba":      {testPicture(7, 3), true},
		"nrgba64":   {image.NewNRGBA64(rect), true},
		"paletted":  {image.NewPaletted(rect, palette.Plan9), false},
		"two-color": {image.NewPaletted(rect, color.Palette{color.Black, color.White}), false},
	} {
		var buf bytes.Buffer
		if err := png.Encode(&buf, tt.img); err != nil {
			t.Fatal(err)
		}
		if got := agreesWithDecodeConfig(t, buf.Bytes()); got != tt.fast {
			t.Errorf("%s: read in place %v, want %v", name, got, tt.fast)
		}
		img, err := Inspect(buf.Bytes(), MIMEPNG, Limits{MaxPixels: 1 << 20, MaxSide: 4096})
		if err != nil || img.Width != 7 || img.Height != 3 {
			t.Errorf("%s: Inspect = %d×%d, %v; want 7×3", name, img.Width, img.Height, err)
		}
	}
}

// TestPNGSizeHeaderBytes walks each IHDR byte that pngSize judges through
// every value, and sizes at the edges, against png.DecodeConfig.
func TestPNGSizeHeaderBytes(t *testing.T) {
	header := func(w, h uint32, tail [5]byte) []byte {
		b := pngHeader(w, h)
		copy(b[24:29], tail[:])
		binary.BigEndian.PutUint32(b[29:33], crc32.ChecksumIEEE(b[12:29]))
		return b
	}
	fast := 0
	for i := 0; i < 5; i++ {
		for v := 0; v < 256; v++ {
			tail := [5]byte{8, 6, 0, 0, 0}
			tail[i] = byte(v)
			if agreesWithDecodeConfig(t, header(640, 480, tail)) {
				fast++
			}
		}
	}
	// Per byte, the values read in place: depth 8 or 16 (2), colour type 0,
	// 2, 4, 6 (4), compression 0 (1), filter 0 (1), interlace 0 or 1 (2).
	if fast != 2+4+1+1+2 {
		t.Errorf("%d single-byte variants read in place, want 10", fast)
	}
	for _, size := range [][2]uint32{{1, 1}, {0, 5}, {5, 0}, {1 << 31, 1}, {1<<31 - 1, 1<<31 - 1}, {1 << 30, 1 << 30}, {1<<30 + 1, 1 << 30}} {
		agreesWithDecodeConfig(t, header(size[0], size[1], [5]byte{8, 6, 0, 0, 0}))
	}
	good := header(640, 480, [5]byte{8, 6, 0, 0, 0})
	for name, b := range map[string][]byte{
		"bad CRC":      append(append([]byte{}, good[:32]...), good[32]^1),
		"cut":          good[:32],
		"IHDR long":    append(append(append([]byte{}, good[:11]...), 14), good[12:]...),
		"not IHDR":     append(append(append([]byte{}, good[:12]...), "IHDX"...), good[16:]...),
		"no signature": append([]byte("\x89PNG\r\n\x1a\x0b"), good[8:]...),
	} {
		if agreesWithDecodeConfig(t, b) {
			t.Errorf("%s: read in place", name)
		}
	}
}

// TestInspectPNGAllocates nothing for the common upload: a PNG without a
// palette, declared as image/png. It is on every paid read's path.
func TestInspectPNGAllocates(t *testing.T) {
	data := encodePNG(t, 64, 32)
	lim := Limits{MaxPixels: 1 << 20, MaxSide: 4096}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Inspect(data, MIMEPNG, lim); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Inspect allocates %v times per PNG, want 0", allocs)
	}
}
