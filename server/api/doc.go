// Package api is Breakwater's HTTP edge: the public API (POST /v1/ocr,
// POST /v1/invites/verify, GET /healthz), the admin API on its own loopback listener, and the
// transport rules every request meets first: client IP from trusted proxies
// only, a body limit enforced before anything is buffered, a request id we
// generate ourselves, panic recovery, and one error handler that answers
// every failure as application/problem+json (RFC 9457).
//
// Echo stays inside this package. Handlers walk the protection layers in the
// order docs/DESIGN.md describes (through server/guard); the package holds
// no thresholds of its own and never writes to disk except through the
// recorders and stores it is given.
package api
