package postgres

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
)

// tlsAdvice says what is wrong with a server's certificate that
// sslmode=verify-full (or verify-ca) refused, or "".
func tlsAdvice(err error, host string) string {
	var hostErr x509.HostnameError
	var authErr x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &hostErr):
		return fmt.Sprintf("; the server's certificate does not name the host it was reached by (%s): connect by a name or address the certificate holds", host)
	case errors.As(err, &authErr):
		return "; the server's certificate is not signed by the CA in sslrootcert (or by one of the system's CAs, without sslrootcert): name the CA that signed it"
	case errors.As(err, &invalid):
		return "; the server's certificate is not valid (expired, not yet valid, or not a server's): " + invalid.Error()
	}
	return ""
}

// badURL is errBadURL, or, when the URL names a certificate or key file
// that cannot be read (pgx reads them as it parses the URL), which
// parameter and path: a path holds no secret.
func badURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errBadURL
	}
	q := u.Query()
	for _, p := range []string{"sslrootcert", "sslcert", "sslkey"} {
		path := q.Get(p)
		if path == "" || path == "system" {
			continue
		}
		if _, err := os.ReadFile(path); err != nil {
			return fmt.Errorf("postgres: %s in %s names a file that cannot be read: %w", p, EnvURL, err)
		}
	}
	return errBadURL
}
