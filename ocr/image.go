package ocr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/jpeg"
	"image/png"
	"mime"
	"strings"

	"golang.org/x/image/webp"
)

// Media types that Inspect accepts, in their canonical spelling.
const (
	MIMEPNG  = "image/png"
	MIMEJPEG = "image/jpeg"
	MIMEWebP = "image/webp"
)

// Errors returned by Inspect.
var (
	// ErrUnsupportedType means the bytes are not PNG, JPEG or (still) WebP,
	// or disagree with the declared media type. HTTP layers map it to 415.
	ErrUnsupportedType = errors.New("ocr: unsupported image type")
	// ErrUndecodable means the header of a supported type cannot be read,
	// or claims an empty image. HTTP layers map it to 422.
	ErrUndecodable = errors.New("ocr: image cannot be decoded")
	// ErrTooManyPixels means width × height, or a side, exceeds the
	// allowed maximum. HTTP layers map it to 422.
	ErrTooManyPixels = errors.New("ocr: image has too many pixels")
)

// Limits bound the size an image may claim in its header. Both matter for
// money: the worst-case cost of a call grows with the number of 768-pixel
// tiles, and a 1 × 40,000,000 header has few pixels but 52,084 tiles.
type Limits struct {
	MaxPixels int64 // width × height; <= 0 refuses every image
	MaxSide   int   // the longer side; <= 0 refuses every image
}

// Image is an upload that passed Inspect.
type Image struct {
	// Data is the upload as received; Inspect does not copy it.
	Data []byte
	// MIME is the sniffed media type: MIMEPNG, MIMEJPEG or MIMEWebP.
	MIME string
	// Width and Height are the dimensions in pixels from the header, both
	// positive.
	Width, Height int
}

// Inspect checks that data is an image we can send upstream, reading only
// its magic bytes and header: nothing is fully decoded, so a header that
// claims 100000×100000 pixels costs nothing.
//
// The magic bytes must be PNG, JPEG or still WebP; GIF, HEIC, AVIF, animated
// WebP and anything else give ErrUnsupportedType. declared is the media type
// the client sent (parameters allowed, "image/jpg" taken as JPEG); "" or
// "application/octet-stream" means none was declared and the sniffed type is
// taken, any other disagreement gives ErrUnsupportedType. A header that does
// not parse, or gives a width or height below 1, gives ErrUndecodable; more
// than lim.MaxPixels pixels, or a side longer than lim.MaxSide, gives
// ErrTooManyPixels.
func Inspect(data []byte, declared string, lim Limits) (Image, error) {
	sniffed := sniff(data)
	if sniffed == "" {
		return Image{}, ErrUnsupportedType
	}
	if want, ok := declaredType(declared); !ok || (want != "" && want != sniffed) {
		return Image{}, ErrUnsupportedType
	}
	if sniffed == MIMEWebP && animatedWebP(data) {
		return Image{}, ErrUnsupportedType
	}

	// The decoder for the sniffed type is called directly rather than through
	// image.DecodeConfig, so the result cannot depend on which formats other
	// packages happen to register.
	var decodeConfig func(*bytes.Reader) (image.Config, error)
	switch sniffed {
	case MIMEPNG:
		if w, h, ok := pngSize(data); ok {
			return checkSize(Image{Data: data, MIME: sniffed, Width: w, Height: h}, lim)
		}
		decodeConfig = func(r *bytes.Reader) (image.Config, error) { return png.DecodeConfig(r) }
	case MIMEJPEG:
		decodeConfig = func(r *bytes.Reader) (image.Config, error) { return jpeg.DecodeConfig(r) }
	case MIMEWebP:
		decodeConfig = func(r *bytes.Reader) (image.Config, error) { return webp.DecodeConfig(r) }
	}
	cfg, err := decodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return Image{}, ErrUndecodable
	}
	return checkSize(Image{Data: data, MIME: sniffed, Width: cfg.Width, Height: cfg.Height}, lim)
}

// checkSize returns img if its size is within lim, else ErrTooManyPixels.
func checkSize(img Image, lim Limits) (Image, error) {
	// width*height <= MaxPixels, without computing the product.
	if lim.MaxPixels <= 0 || int64(img.Width) > lim.MaxPixels/int64(img.Height) ||
		img.Width > lim.MaxSide || img.Height > lim.MaxSide {
		return Image{}, ErrTooManyPixels
	}
	return img, nil
}

// pngSize reads the size of the common PNG, whose first chunk is a valid
// IHDR of a colour type without a palette, in place and without
// allocating: for such a file png.DecodeConfig reads no further and
// returns the same size (FuzzInspect holds the two to agreement). ok is
// false for anything else (a palette, whose colours DecodeConfig reads on,
// or a header it would refuse), which goes to png.DecodeConfig.
func pngSize(data []byte) (w, h int, ok bool) {
	// Signature (8), IHDR length (4) and type (4), data (13), CRC (4).
	const end = 8 + 4 + 4 + 13 + 4
	if len(data) < end || string(data[:8]) != pngSignature || binary.BigEndian.Uint32(data[8:12]) != 13 || string(data[12:16]) != "IHDR" {
		return 0, 0, false
	}
	ihdr := data[16:29]
	if crc32.ChecksumIEEE(data[12:29]) != binary.BigEndian.Uint32(data[29:end]) {
		return 0, 0, false
	}
	depth, colour, compression, filter, interlace := ihdr[8], ihdr[9], ihdr[10], ihdr[11], ihdr[12]
	if compression != 0 || filter != 0 || interlace > 1 {
		return 0, 0, false
	}
	switch colour {
	case 0: // greyscale
		if depth != 1 && depth != 2 && depth != 4 && depth != 8 && depth != 16 {
			return 0, 0, false
		}
	case 2, 4, 6: // truecolour, greyscale with alpha, truecolour with alpha
		if depth != 8 && depth != 16 {
			return 0, 0, false
		}
	default: // 3, paletted, or no colour type at all
		return 0, 0, false
	}
	w32, h32 := int32(binary.BigEndian.Uint32(ihdr[0:4])), int32(binary.BigEndian.Uint32(ihdr[4:8]))
	if w32 <= 0 || h32 <= 0 {
		return 0, 0, false
	}
	// The decoder also refuses a pixel count, or its 8 bytes a pixel, that
	// overflows an int.
	pixels := int64(w32) * int64(h32)
	if n := int(pixels); int64(n) != pixels || n != n*8/8 {
		return 0, 0, false
	}
	return int(w32), int(h32), true
}

// pngSignature opens every PNG file.
const pngSignature = "\x89PNG\r\n\x1a\n"

// sniff names the media type of data by its magic bytes, or returns "".
func sniff(data []byte) string {
	switch {
	case bytes.HasPrefix(data, []byte(pngSignature)):
		return MIMEPNG
	case bytes.HasPrefix(data, []byte("\xff\xd8\xff")):
		return MIMEJPEG
	case len(data) >= 16 && string(data[0:4]) == "RIFF" && string(data[8:12]) == "WEBP" &&
		string(data[12:15]) == "VP8": // VP8 (lossy), VP8L (lossless), VP8X (extended)
		return MIMEWebP
	}
	return ""
}

// animatedWebP reports whether an extended WebP header sets the animation
// flag: its frames are not something the model reads, and x/image/webp
// cannot decode them either.
func animatedWebP(data []byte) bool {
	const animationFlag = 0x02
	return len(data) > 20 && string(data[12:16]) == "VP8X" && data[20]&animationFlag != 0
}

// declaredType returns the canonical media type for a client's declaration,
// "" if none was declared, and ok false if it does not parse.
func declaredType(declared string) (string, bool) {
	switch declared {
	case MIMEPNG, MIMEJPEG, MIMEWebP: // as mime.ParseMediaType reads them, without its allocations
		return declared, true
	}
	if strings.TrimSpace(declared) == "" {
		return "", true
	}
	mt, _, err := mime.ParseMediaType(declared)
	if err != nil {
		return "", false
	}
	switch mt { // ParseMediaType lower-cases the type
	case "application/octet-stream":
		return "", true
	case "image/jpg", "image/pjpeg":
		return MIMEJPEG, true
	}
	return mt, true
}
