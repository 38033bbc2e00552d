// Package ocr reads serial numbers off label photos.
//
// It provides three things: Inspect, which checks an upload (PNG, JPEG or
// WebP, by magic bytes and header only) before anything is spent on it;
// Price, which turns the token counts of a call into integer micro-dollars
// and bounds the cost of a call before it is made; and two readers with the
// same Read method: Gemini, which calls Google's generateContent REST
// endpoint, and Simulated, which answers deterministically without any
// network for development and load tests.
//
// The Gemini reader is a small REST client of our own rather than the
// google.golang.org/genai SDK. The SDK reads GEMINI_API_KEY, GOOGLE_API_KEY
// and GOOGLE_GEMINI_BASE_URL from the environment by itself, which would let
// the process environment override config.toml behind our back, and it adds
// about 10 MB of grpc and auth packages to the binary; we use four fields of
// the wire format (inlineData, text, generationConfig, usageMetadata), which
// fit in a few structs.
//
// What the package refuses to do: it never fully decodes an image (HEIC,
// AVIF, GIF and anything else is refused outright), it never trusts the
// model (its text must parse strictly as {"serials":[...]} and every value
// must match the configured serial pattern), it retries at most once and
// only on 429 and 503, and it never puts the API key or upstream body text
// into an error string. Deciding whether a call may be afforded, and
// recording what it cost, belong to the caller.
package ocr
