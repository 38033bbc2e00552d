package ocr

import (
	"fmt"
	"math"
)

// Usage is the token counts of one call, as the provider reported them.
type Usage struct {
	// PromptTokens is the input: the image and the prompt text.
	PromptTokens int
	// CandidatesTokens is the output text.
	CandidatesTokens int
	// ThoughtsTokens is thinking output, billed at the output price.
	ThoughtsTokens int
}

// Known reports whether u can be what a call was billed. Every call sends
// an image, at least 258 tokens, so a reply that reports no prompt tokens
// (usageMetadata missing, or negative counts, which read as zero) leaves
// the cost unknown: the caller should keep the worst case.
func (u Usage) Known() bool { return u.PromptTokens > 0 }

// promptTokenBound bounds the tokens of our prompt text and response schema.
// The prompt is about 40 tokens; the bound is generous on purpose, since
// WorstCase must never be below what a call is billed.
const promptTokenBound = 300

// Image token accounting, as Gemini documents it.
const (
	tokensPerTile = 258
	smallImageMax = 384 // both sides at most this: a single tile
	tileSide      = 768
)

// ImageTokens is Gemini's token count for an image of width × height pixels:
// 258 if both sides are at most 384 px, else 258 for each 768×768 tile,
// ceil(width/768) × ceil(height/768) × 258. Sides below 1 count as 1; a
// result too large for an int is math.MaxInt.
func ImageTokens(width, height int) int {
	w, h := int64(max(width, 1)), int64(max(height, 1))
	if w <= smallImageMax && h <= smallImageMax {
		return tokensPerTile
	}
	tilesW := (w + tileSide - 1) / tileSide
	tilesH := (h + tileSide - 1) / tileSide
	return int(mulSat(mulSat(tilesW, tilesH, math.MaxInt64), tokensPerTile, math.MaxInt))
}

// Cost is what a call with usage u costs, in integer micro-dollars rounded
// up: PromptTokens at the input price plus CandidatesTokens + ThoughtsTokens
// at the output price, both per million tokens. Zero fields of p take their
// defaults; prices count to a millionth of a dollar per million tokens;
// negative counts count as zero; the result saturates at math.MaxInt64.
func (p Price) Cost(u Usage) int64 {
	p = p.withDefaults()
	in := picoPerToken(p.InputUSDPerMillion)
	out := picoPerToken(p.OutputUSDPerMillion)
	// USD per million tokens equals micro-dollars per token, so a price
	// times 1e6 is pico-dollars per token: integer arithmetic from here on.
	outTokens := addSat(nonNeg(u.CandidatesTokens), nonNeg(u.ThoughtsTokens))
	pico := addSat(mulSat(nonNeg(u.PromptTokens), in, math.MaxInt64), mulSat(outTokens, out, math.MaxInt64))
	const picoPerMicro = 1_000_000
	if pico > math.MaxInt64-(picoPerMicro-1) {
		return math.MaxInt64 / picoPerMicro
	}
	return (pico + picoPerMicro - 1) / picoPerMicro
}

// ImageTokens is the most tokens p's model counts for a width × height
// image: Gemini 2.x's tiles (the function ImageTokens), or for Gemini 3 and
// later the ceiling of the media_resolution level sent, whatever the size.
func (p Price) ImageTokens(width, height int) int {
	p = p.withDefaults()
	if p.perImage == tilesRule {
		return ImageTokens(width, height)
	}
	return p.perImage
}

// WithPricesOf returns p, its image rule and output cap kept, at q's input
// and output prices and their changes in time: a reload applies new prices to the model running,
// whose client sends p's cap and media_resolution until a restart.
func (p Price) WithPricesOf(q Price) Price {
	p.InputUSDPerMillion, p.OutputUSDPerMillion = q.InputUSDPerMillion, q.OutputUSDPerMillion
	p.later, p.fixedIn, p.fixedOut = q.later, q.fixedIn, q.fixedOut
	return p
}

// ImageRule says how p counts an image's tokens, for config check.
func (p Price) ImageRule() string {
	p = p.withDefaults()
	if p.perImage == tilesRule {
		return "image tokens by Gemini 2.x 768-px tiles (258 per tile)"
	}
	return fmt.Sprintf("image tokens by media_resolution, at most %d per image", p.perImage)
}

// WorstCase is the most a call on a width × height image can cost, in
// micro-dollars: the image's tokens (p.ImageTokens) plus a generous bound
// on the prompt's tokens as input, and MaxOutputTokens as output, which
// caps thinking and answer together. A failed call may still be billed;
// charge this for it.
func (p Price) WorstCase(width, height int) int64 {
	p = p.withDefaults()
	prompt := addSat(int64(p.ImageTokens(width, height)), promptTokenBound)
	return p.Cost(Usage{
		PromptTokens:     int(min(prompt, math.MaxInt)),
		CandidatesTokens: p.MaxOutputTokens,
	})
}

func picoPerToken(usdPerMillion float64) int64 {
	v := math.Round(usdPerMillion * 1e6)
	switch {
	case !(v > 0): // negative or NaN
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(v)
}

func nonNeg(n int) int64 { return int64(max(n, 0)) }

// mulSat returns a*b for non-negative a and b, or limit if it is larger.
func mulSat(a, b, limit int64) int64 {
	if a != 0 && b > limit/a {
		return limit
	}
	return min(a*b, limit)
}

// addSat returns a+b for non-negative a and b, saturating at MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
