package api

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/edge"
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
func (s *Server) storedAnswer(user, key string, now time.Time) (budget.Answer, bool) {
	if s.d.Answers == nil {
		return budget.Answer{}, false
	}
	a, at, found, err := s.d.Answers.StoredAnswer(user, key)
	if err != nil {
		s.warnStore(answersUnreadable, "idempotency answers unreadable: the request is made again", "err", err)
	}
	return a, found && err == nil && now.Sub(at) < s.d.IdempotencyTTL
}

// recentRead is user's read of the image fp, if one was made within
// ocr.dedupe_window.
func (s *Server) recentRead(user string, fp [32]byte, now time.Time) (budget.Answer, bool) {
	if s.d.Answers == nil || s.d.DedupeWindow <= 0 {
		return budget.Answer{}, false
	}
	a, at, found, err := s.d.Answers.RecentRead(user, fp)
	if err != nil {
		s.warnStore(recentUnreadable, "recent reads unreadable: the image is read again", "err", err)
	}
	return a, found && err == nil && now.Sub(at) < s.d.DedupeWindow
}

// replay answers a repeat of an idempotent request with the stored answer,
// byte for byte; nothing is counted but layers 0 and 1.
func (s *Server) replay(r *ocrRequest, a budget.Answer) error {
	s.recordAnswered(r, detect.OutcomeReplayed)
	r.c.Response().Header()[headerReplayed] = replayedTrue
	return writeJSON(r.c, a.Status, a.Body)
}

// answerCached answers the same image again with its earlier read; it
// uses neither the quota, the daily line nor the budget. With an
// idempotency key the answer is kept under the key first, as a read's
// would be, so that the key stays bound to its image: a repeat is this
// answer byte for byte, the key with another image 422. A key that cannot
// be kept is logged and the answer still sent: at worst a repeat is read
// again, and paid for as a read. now is when the window was looked at.
func (s *Server) answerCached(r *ocrRequest, a budget.Answer, now time.Time) error {
	s.recordAnswered(r, detect.OutcomeCached)
	quota := r.plan.MonthlyQuota
	used := s.guard.Used(r.who.UserID, now)
	body, err := json.Marshal(ocrResponse{
		Serials: nonNil(a.Serials), Rejected: nonNil(a.Rejected),
		Quota:     quotaResponse{Limit: quota, Used: used, Remaining: max(quota-used, 0)},
		Simulated: a.Simulated, Cached: true,
	})
	if err != nil {
		return err
	}
	body = append(body, '\n')
	if r.key != "" {
		kept := budget.Answer{Fingerprint: a.Fingerprint, IdempotencyKey: r.key, Status: http.StatusOK, Body: body}
		if err := s.d.Answers.KeepAnswer(r.who.UserID, r.start, kept); err != nil {
			s.log.Warn("idempotency key of a cached answer not kept: a repeat is read again", "user", r.who.UserID,
				"request_id", r.id, "err", err)
		} else {
			r.kept = true
		}
	}
	return writeJSON(r.c, http.StatusOK, body)
}

// readsInFlight are the reads under way that the dedupe window may
// answer from, one per user and image: a request for an image being read
// waits for that read (Server.readOnce). It holds only reads in progress.
// Safe for concurrent use.
type readsInFlight struct {
	mu    sync.Mutex
	reads map[readKey]chan struct{}
}

type readKey struct {
	user string
	fp   [32]byte
}

// lead makes the caller the reader of user's image fp when nobody is
// reading it: wait is nil, and done must be called once the read is over
// (its answer recorded, or not to be). When a read of it is under way,
// wait is closed once that read is over.
func (r *readsInFlight) lead(user string, fp [32]byte) (done func(), wait <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := readKey{user, fp}
	if ch, ok := r.reads[k]; ok {
		return nil, ch
	}
	if r.reads == nil {
		r.reads = map[readKey]chan struct{}{}
	}
	ch := make(chan struct{})
	r.reads[k] = ch
	return func() {
		r.mu.Lock()
		delete(r.reads, k)
		r.mu.Unlock()
		close(ch)
	}, nil
}

// recordAnswered records a read answered from storage in the statistics.
func (s *Server) recordAnswered(r *ocrRequest, outcome string) {
	s.d.Events.Record(detect.Event{
		Time: r.start, UserID: r.who.UserID, KeyID: r.who.KeyID, Plan: r.who.Plan, IP: r.ip, Route: ocrRoute,
		Outcome: outcome, Status: http.StatusOK,
	})
}

// The header of a replayed answer, as the problems' headers are kept.
const headerReplayed = "Idempotent-Replayed"

var (
	replayedTrue    = []string{"true"}
	jsonContentType = []string{echo.MIMEApplicationJSON}
)

// writeJSON answers status with body as application/json: echo's Blob,
// with the header value shared rather than made for each answer.
func writeJSON(c echo.Context, status int, body []byte) error {
	h := c.Response().Header()
	if edge.FirstValue(h, echo.HeaderContentType) == "" {
		h[echo.HeaderContentType] = jsonContentType
	}
	c.Response().WriteHeader(status)
	_, err := c.Response().Write(body)
	return err
}

// answerBody is the body of a successful read, as sent and as kept for a
// repeat of its idempotency key: the bytes json.Marshal makes of
// ocrResponse, and a newline, written by hand into one buffer, since the
// shape is fixed (TestAnswerBodyIsJSON holds the two to the same bytes).
func answerBody(res ocr.Result, quota, used int64) []byte {
	n := len(`{"serials":[],"rejected":[],"quota":{"limit":,"used":,"remaining":},"model":"","simulated":true}`) + 1 + 3*20 + 2*len(res.Model)
	for _, s := range res.Serials {
		n += len(s) + 3
	}
	for _, s := range res.Rejected {
		n += len(s) + 3
	}
	b := make([]byte, 0, n)
	b = append(b, `{"serials":`...)
	b = appendJSONStrings(b, res.Serials)
	b = append(b, `,"rejected":`...)
	b = appendJSONStrings(b, res.Rejected)
	b = append(b, `,"quota":{"limit":`...)
	b = strconv.AppendInt(b, quota, 10)
	b = append(b, `,"used":`...)
	b = strconv.AppendInt(b, used, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, max(quota-used, 0), 10)
	b = append(b, '}')
	if res.Model != "" {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, res.Model)
	}
	if res.Simulated {
		b = append(b, `,"simulated":true`...)
	}
	return append(b, '}', '\n')
}

// appendJSONStrings appends ss as a JSON array, [] when it is nil.
func appendJSONStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: the quote, the backslash and the control characters, <, > and & (as \u003c and
// so on), U+2028 and U+2029, and each byte of invalid UTF-8 as \ufffd.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// A storeWarning is a warning of the stored answers and the key claims,
// each of which a request may meet: with the database down, every request
// would log it.
type storeWarning int

const (
	answersUnreadable storeWarning = iota
	recentUnreadable
	keyNotClaimed
	keyNotGivenBack
	storeWarnings // how many
)

// storeWarnEvery is the least time between two log lines of one store
// warning; the next line says how many were held back.
const storeWarnEvery = 10 * time.Second

// warnStore logs a store warning, at most once per storeWarnEvery each.
func (s *Server) warnStore(w storeWarning, msg string, args ...any) {
	if ok, held := s.storeLogs[w].Allow(s.now(), storeWarnEvery); ok {
		s.log.Warn(msg, append(args, "unlogged_since_last", held)...)
	}
}
