package routes

import (
	"errors"
	"net/url"
	"strings"
)

// ErrBadPath is a request path that does not parse: not absolute, a bad
// %-escape, or a control character once unescaped.
var ErrBadPath = errors.New("routes: the request path does not parse")

// Normalize is the path a request is matched on, from its path as sent
// (escaped, without the query). Web frameworks serve many spellings of a
// path as one route, and a spelling the table did not match would reach
// the app unguarded, so the path is reduced the way the most lenient of
// them would read it:
//
//   - %-escapes are decoded once, %2F included: an escaped slash then
//     separates segments like any other, which matches more, never less
//     ("/api%2Fcheckout" is "/api/checkout");
//   - a backslash is a slash, escaped or not, as Windows servers and
//     Node's url.parse read it ("/api\checkout" is "/api/checkout");
//   - the ";parameters" of every segment are removed ("/a;x=1/b;y" is "/a/b");
//   - spaces around a segment and dots at its end are removed, as old
//     Spring (trimTokens) and Windows servers read them ("/api/checkout."
//     and "/api/checkout%20" are "/api/checkout"; "/a/.../b" is "/a/b");
//   - repeated slashes are folded, dot segments resolved ("/api/./x/../b"
//     is "/api/b"; ".." never climbs above the root);
//   - a trailing slash is removed ("/contact/" is "/contact").
//
// Letters keep their case: the Table ignores it for routes that are not
// case_sensitive. A path that is already normal is returned as it is,
// without a copy.
func Normalize(escaped string) (string, error) {
	if !strings.HasPrefix(escaped, "/") {
		return "", ErrBadPath
	}
	if isNormal(escaped) {
		return escaped, nil
	}
	p, err := url.PathUnescape(escaped)
	if err != nil {
		return "", ErrBadPath
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return "", ErrBadPath
		}
	}
	p = strings.ReplaceAll(p, `\`, "/")
	segs := make([]string, 0, strings.Count(p, "/"))
	for seg := range strings.SplitSeq(p, "/") {
		seg, _, _ = strings.Cut(seg, ";")
		seg = strings.Trim(seg, " ")
		if seg != "." && seg != ".." {
			seg = strings.TrimRight(seg, ". ")
		}
		switch seg {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	return "/" + strings.Join(segs, "/"), nil
}

// isNormal reports whether Normalize would return p unchanged: no escape,
// no parameter, no backslash, no control character, no empty or dot
// segment, no segment with a space around it or a dot at its end, no
// trailing slash.
func isNormal(p string) bool {
	if p == "/" {
		return true
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '%' || c == ';' || c == '\\' || c < 0x20 || c == 0x7f:
			return false
		case c == '/':
			seg := p[i+1:]
			if j := strings.IndexByte(seg, '/'); j >= 0 {
				seg = seg[:j]
			}
			if seg == "" || seg[0] == ' ' || seg[len(seg)-1] == ' ' || seg[len(seg)-1] == '.' {
				return false
			}
		}
	}
	return true
}

// URIPath is the normalized path of a request URI as a proxy forwards it
// (X-Forwarded-Uri, X-Original-URI): origin form, the query left out.
// ErrBadPath if it is not an absolute path (an absolute URI included), if
// its path has a '#', or if it does not normalize. No client sends a
// fragment, and nginx forwards a '#' as it came, where the app may read it
// as the fragment's start (Node's url.parse: "/api\checkout#x" is
// "/api/checkout") or as a letter ("/page#/../api/checkout", cleaned, is
// "/api/checkout"): no one reading of it is safe.
func URIPath(uri string) (string, error) {
	p, _, _ := strings.Cut(uri, "?")
	if strings.IndexByte(p, '#') >= 0 {
		return "", ErrBadPath
	}
	return Normalize(p)
}
