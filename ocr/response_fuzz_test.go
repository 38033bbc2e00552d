package ocr

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strconv"
	"testing"
	"unicode/utf8"
)

// FuzzParseResponse builds well-formed generateContent responses from
// fuzzed parts (the model's text, a thought, the finish reason, the block
// reason, token counts, the model version, the serial pattern) and checks
// what parseResponse makes of them:
//   - the usage is the reported counts, negatives as 0, and is there also
//     beside an error (the call is billed all the same);
//   - the model is the reported version when it is short printable text,
//     else the configured one;
//   - MAX_TOKENS is bad output, a blocking finish or block reason is
//     blocked, an unknown finish is bad output;
//   - on STOP the result is exactly what the model's visible text parses
//     to (a thought part never adds a serial), and every serial matches the
//     configured pattern, is trimmed and appears once.
//
// FuzzParseOutput covers the raw body; this target reaches the branches a
// raw body seldom does.
func FuzzParseResponse(f *testing.F) {
	f.Add(`{"serials": ["SN-12345", " SN-12345 ", "A1B2C3D4", "S/N", "serial 99"]}`, "", "STOP", "", int64(298), int64(24), int64(0), "gemini-2.5-flash", uint8(0))
	f.Add(`{"serials": ["`, `{"serials": ["THOUGHT-1"]}`, "STOP", "", int64(1), int64(2), int64(3), "", uint8(0))
	f.Add(`{"serials":[]}`, "", "", "", int64(-5), int64(0), int64(12), "gemini-2.5-flash-001", uint8(1))
	f.Add(`{"serials":["1234","12345"]}`, "", "MAX_TOKENS", "", int64(10), int64(256), int64(0), "gemini-2.5-pro", uint8(1))
	f.Add("", "", "SAFETY", "", int64(258), int64(0), int64(0), "gemini-2.5-flash", uint8(0))
	f.Add("", "", "", "PROHIBITED_CONTENT", int64(258), int64(0), int64(0), "\x00bad", uint8(2))
	f.Add(`{"serials":["abc","ABC"," abc "]}`, "", "MALFORMED_FUNCTION_CALL", "", int64(1<<40), int64(1), int64(1), "m", uint8(2))
	f.Add("```json\n{\"serials\":[\"SN-1\"]}\n```", "", "STOP", "", int64(0), int64(0), int64(0), "gemini-\u00e9", uint8(0))
	patterns := []*regexp.Regexp{
		regexp.MustCompile(DefaultSerialPattern),
		regexp.MustCompile(`^\d{4}$`),
		regexp.MustCompile(`^[a-z]+$`),
	}
	f.Fuzz(func(t *testing.T, text, thought, finish, block string, prompt, cand, thoughts int64, version string, pat uint8) {
		pattern := patterns[int(pat)%len(patterns)]
		body := geminiBody(text, thought, finish, block, prompt, cand, thoughts, version)
		res, err := parseResponse(body, 200, pattern, DefaultModel)

		// json.Marshal writes invalid UTF-8 as U+FFFD; compare with what
		// the body says.
		var sent struct {
			Candidates []struct {
				Content struct{ Parts []struct{ Text string } }
			}
			ModelVersion string
		}
		if jerr := json.Unmarshal(body, &sent); jerr != nil {
			t.Fatalf("test body is not JSON: %v", jerr)
		}
		if want := (Usage{PromptTokens: clampInt(prompt), CandidatesTokens: clampInt(cand), ThoughtsTokens: clampInt(thoughts)}); res.Usage != want {
			t.Fatalf("usage %+v, want %+v (error %v)", res.Usage, want, err)
		}
		v := sent.ModelVersion
		wantModel := v
		if v == "" || len(v) > maxModelBytes || !printable(v) {
			wantModel = DefaultModel
		}
		if res.Model != wantModel {
			t.Fatalf("model %q for version %q, want %q", res.Model, v, wantModel)
		}

		reason := func() string {
			var ue *UpstreamError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T %v, want *UpstreamError", err, err)
			}
			return ue.Reason
		}
		switch {
		case block != "":
			if err == nil || reason() != ReasonBlocked {
				t.Fatalf("block reason %q: error %v", block, err)
			}
			return
		case finish == "MAX_TOKENS":
			if err == nil || reason() != ReasonBadOutput {
				t.Fatalf("MAX_TOKENS: error %v", err)
			}
			return
		case blockedFinish[finish]:
			if err == nil || reason() != ReasonBlocked {
				t.Fatalf("finish %s: error %v", finish, err)
			}
			return
		case finish != "STOP" && finish != "":
			if err == nil || reason() != ReasonBadOutput {
				t.Fatalf("finish %q: error %v", finish, err)
			}
			return
		}
		visible := sent.Candidates[0].Content.Parts[0].Text
		serials, rejected, perr := parseOutput(visible, pattern)
		if perr != nil {
			if err == nil || reason() != ReasonBadOutput {
				t.Fatalf("visible text %q does not parse (%v), but error %v", visible, perr, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("visible text %q parses, but error %v", visible, err)
		}
		if !reflect.DeepEqual(res.Serials, serials) || !reflect.DeepEqual(res.Rejected, rejected) {
			t.Fatalf("serials %q rejected %q, the visible text gives %q %q", res.Serials, res.Rejected, serials, rejected)
		}
		checkOutput(t, res.Serials, res.Rejected, nil, pattern)
	})
}

// geminiBody is a generateContent response: one candidate whose parts are
// the thought (if any, marked as one) and the text, the usage, the version
// and, when block is set, a promptFeedback with no candidate at all.
func geminiBody(text, thought, finish, block string, prompt, cand, thoughts int64, version string) []byte {
	type part struct {
		Text    string `json:"text"`
		Thought bool   `json:"thought,omitempty"`
	}
	var parts []part
	parts = append(parts, part{Text: text})
	if thought != "" {
		parts = append(parts, part{Text: thought, Thought: true})
	}
	resp := map[string]any{
		"usageMetadata": map[string]any{
			"promptTokenCount": prompt, "candidatesTokenCount": cand, "thoughtsTokenCount": thoughts,
			"totalTokenCount": prompt + cand + thoughts,
		},
		"modelVersion": version,
	}
	if block != "" {
		resp["promptFeedback"] = map[string]any{"blockReason": block}
	} else {
		resp["candidates"] = []any{map[string]any{
			"content":      map[string]any{"parts": parts, "role": "model"},
			"finishReason": finish,
			"index":        0,
		}}
	}
	b, err := json.Marshal(resp)
	if err != nil {
		panic(err)
	}
	return b
}

func clampInt(n int64) int { return max(int(n), 0) }

func printable(s string) bool {
	for _, r := range s {
		if !strconv.IsPrint(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}
