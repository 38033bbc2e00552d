package server

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/keys"
)

// Answering a read again without a second paid call: the repeat of a
// request by its Idempotency-Key (the stored answer, byte for byte), and
// the same image again within ocr.dedupe_window (its serials, "cached").
// Both answers come from what the read's usage transaction kept
// (budget.Answer), so a charged read never lacks its answer.

// maxIdempotencyKey is the longest Idempotency-Key accepted, in bytes.
const maxIdempotencyKey = 255

// idempotencyKey reads the Idempotency-Key header: 1 to 255 printable
// ASCII characters, as a bare value or as a Structured Field string
// ("..." with \" and \\ escapes, as draft-ietf-httpapi-idempotency-key-
// header writes it). "" when there is none.
func idempotencyKey(h http.Header) (string, error) {
	values := h.Values("Idempotency-Key")
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", errIdempotencyKeyInvalid
	}
	key := values[0]
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		var ok bool
		if key, ok = unquoteSF(key[1 : len(key)-1]); !ok {
			return "", errIdempotencyKeyInvalid
		}
	}
	if key == "" || len(key) > maxIdempotencyKey {
		return "", errIdempotencyKeyInvalid
	}
	for i := range len(key) {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", errIdempotencyKeyInvalid
		}
	}
	return key, nil
}

// unquoteSF undoes a Structured Field string's escapes; only \" and \\
// exist, and a bare " may not appear.
func unquoteSF(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if i+1 == len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", false
			}
			i++
			b.WriteByte(s[i])
		case c == '"':
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// fingerprint names an image: the SHA-256 of its declared type and bytes.
func fingerprint(img ocr.Image) [32]byte {
	h := sha256.New()
	h.Write([]byte(img.MIME))
	h.Write([]byte{0})
	h.Write(img.Data)
	var fp [32]byte
	h.Sum(fp[:0])
	return fp
}

// pendingKeys are the idempotency keys whose first request is in flight:
// a repeat meanwhile is told to wait (409). Memory holds only these.
type pendingKeys struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// acquire marks user's key in flight; false if it already is.
func (p *pendingKeys) acquire(user, key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[string]struct{}{}
	}
	k := user + "\x00" + key
	if _, busy := p.keys[k]; busy {
		return false
	}
	p.keys[k] = struct{}{}
	return true
}

func (p *pendingKeys) release(user, key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.keys, user+"\x00"+key)
}

// storedAnswer is user's answer kept under key, if one was kept within
// ocr.idempotency_ttl. A store that cannot be read answers as if none was
// kept: the request is then made again, at worst one more paid call.
func (s *Server) storedAnswer(user, key string) (budget.Answer, bool) {
	if s.d.Answers == nil {
		return budget.Answer{}, false
	}
	a, at, found, err := s.d.Answers.StoredAnswer(user, key)
	if err != nil {
		s.log.Warn("idempotency answers unreadable: the request is made again", "err", err)
	}
	return a, found && err == nil && s.now().Sub(at) < s.d.IdempotencyTTL
}

// recentRead is user's read of the image fp, if one was made within
// ocr.dedupe_window.
func (s *Server) recentRead(user string, fp [32]byte) (budget.Answer, bool) {
	if s.d.Answers == nil || s.d.DedupeWindow <= 0 {
		return budget.Answer{}, false
	}
	a, at, found, err := s.d.Answers.RecentRead(user, fp)
	if err != nil {
		s.log.Warn("recent reads unreadable: the image is read again", "err", err)
	}
	return a, found && err == nil && s.now().Sub(at) < s.d.DedupeWindow
}

// replay answers a repeat of an idempotent request with the stored answer,
// byte for byte; nothing is counted but layers 0 and 1.
func (s *Server) replay(c echo.Context, start time.Time, id keys.Identity, a budget.Answer) error {
	s.recordAnswered(c, start, id, detect.OutcomeReplayed)
	c.Response().Header().Set("Idempotent-Replayed", "true")
	return c.Blob(a.Status, echo.MIMEApplicationJSON, a.Body)
}

// answerCached answers the same image again with its earlier read; it
// uses neither the quota, the daily line nor the budget.
func (s *Server) answerCached(c echo.Context, start time.Time, id keys.Identity, quota int64, a budget.Answer) error {
	s.recordAnswered(c, start, id, detect.OutcomeCached)
	used := s.ocrGuard.Used(id.UserID, s.now())
	return c.JSON(http.StatusOK, ocrResponse{
		Serials: nonNil(a.Serials), Rejected: nonNil(a.Rejected),
		Quota:     quotaResponse{Limit: quota, Used: used, Remaining: max(quota-used, 0)},
		Simulated: a.Simulated, Cached: true,
	})
}

// recordAnswered records a read answered from storage in the statistics.
func (s *Server) recordAnswered(c echo.Context, start time.Time, id keys.Identity, outcome string) {
	s.d.Events.Record(detect.Event{
		Time: start, UserID: id.UserID, KeyID: id.KeyID, Plan: id.Plan, IP: c.RealIP(), Route: "/v1/ocr",
		Outcome: outcome, Status: http.StatusOK,
	})
}

// answerBody is the body of a successful read, as sent and as kept for a
// repeat of its idempotency key.
func answerBody(res ocr.Result, quota, used int64) ([]byte, error) {
	b, err := json.Marshal(ocrResponse{
		Serials: nonNil(res.Serials), Rejected: nonNil(res.Rejected),
		Quota:     quotaResponse{Limit: quota, Used: used, Remaining: max(quota-used, 0)},
		Simulated: res.Simulated,
	})
	return append(b, '\n'), err
}
