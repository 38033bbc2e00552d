package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// testCA is a certificate authority a test makes.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert is a server certificate the CA signs for localhost and
// 127.0.0.1, as PEM: the certificate and its key.
func (ca testCA) serverCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// writeServerFile writes a file of the server's data folder, owned by
// the server's user when the test runs as root (PostgreSQL refuses a key
// that others may read, or that is not its own).
func writeServerFile(data, name string, body []byte) error {
	path := filepath.Join(data, name)
	if err := os.WriteFile(path, body, 0o600); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// The documented URL, sslmode=verify-full with sslrootcert, against a
// server whose certificate a CA of the test's signed for 127.0.0.1: it
// connects, config check passes and an instance serves paid reads. A
// server reached by an address its certificate does not name, or a CA
// that did not sign it, is refused by config check and by serve, each
// saying which, and neither prints the password.
func TestTLSVerifyFull(t *testing.T) {
	t.Parallel() // a cluster of its own: its start is mostly waiting
	ca, other := newTestCA(t, "breakwater test CA"), newTestCA(t, "another CA")
	certPEM, keyPEM := ca.serverCert(t)
	c := pgtest.NewClusterWith(t, pgtest.Options{
		Listen:   "127.0.0.1,127.0.0.2",
		Settings: []string{"ssl=on"},
		Init: func(data string) error {
			if err := writeServerFile(data, "server.crt", certPEM); err != nil {
				return err
			}
			if err := writeServerFile(data, "server.key", keyPEM); err != nil {
				return err
			}
			// The role breakwater_app comes in over TLS with its password, never
			// without TLS; the test's superuser as pgtest lets it.
			hba, err := os.ReadFile(filepath.Join(data, "pg_hba.conf"))
			if err != nil {
				return err
			}
			hba = append([]byte("hostssl all breakwater_app 127.0.0.0/8 scram-sha-256\nhost all breakwater_app 127.0.0.0/8 reject\n"), hba...)
			return writeServerFile(data, "pg_hba.conf", hba)
		},
	})
	const password = "Tls-p4ss-Quokka"
	execAs(t, c.URL("postgres"), "CREATE ROLE breakwater_app LOGIN PASSWORD '"+password+"'")
	execAs(t, c.URL("postgres"), "CREATE DATABASE breakwater OWNER breakwater_app")
	dir := t.TempDir()
	caFile, otherFile := filepath.Join(dir, "db-ca.crt"), filepath.Join(dir, "other-ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherFile, other.pem, 0o644); err != nil {
		t.Fatal(err)
	}

	m := regexp.MustCompile(`export ` + postgres.EnvURL + `='([^']+)'`).FindStringSubmatch(instancesSnippet(t, "tls-url"))
	if m == nil {
		t.Fatal("the tls-url snippet sets no " + postgres.EnvURL)
	}
	documented := m[1]
	for _, part := range []string{"PASSWORD", "@db.example.net:5432/", "sslmode=verify-full", "sslrootcert=/etc/breakwater/db-ca.crt"} {
		if !strings.Contains(documented, part) {
			t.Fatalf("the documented URL %s has no %q", documented, part)
		}
	}
	urlFor := func(host, ca string) string {
		u := strings.Replace(documented, ":PASSWORD@", ":"+password+"@", 1)
		u = strings.Replace(u, "@db.example.net:5432/", fmt.Sprintf("@%s:%d/", host, c.Port()), 1)
		return strings.Replace(u, "sslrootcert=/etc/breakwater/db-ca.crt", "sslrootcert="+ca, 1)
	}
	config := writeConfig(t, instancesTOML(t)+`
[server]
listen = "127.0.0.1:0"
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
`)
	env := func(url string) map[string]string {
		return map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": migrateSecret}
	}

	good := env(urlFor("127.0.0.1", caFile))
	if out, err := cliRun(config, good, "config", "check"); err != nil {
		t.Fatalf("config check over verify-full: %v\n%s", err, out)
	}
	serveReads(t, config, good, map[string]int{"alice": 2})
	// And not by chance without TLS: pg_hba.conf lets breakwater_app in only over it.
	plain := env(strings.Replace(urlFor("127.0.0.1", caFile), "sslmode=verify-full", "sslmode=disable", 1))
	if out, err := cliRun(config, plain, "config", "check"); err == nil || !strings.Contains(err.Error(), "pg_hba.conf") {
		t.Fatalf("config check without TLS: %v, want the server's refusal\n%s", err, out)
	}

	for _, tc := range []struct {
		name, url, want string
	}{
		{"another host", urlFor("127.0.0.2", caFile), "does not name the host it was reached by (127.0.0.2)"},
		{"another CA", urlFor("127.0.0.1", otherFile), "not signed by the CA in sslrootcert"},
		{"no CA file", urlFor("127.0.0.1", filepath.Join(dir, "none.crt")), "sslrootcert in " + postgres.EnvURL + " names a file that cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := cliRun(config, env(tc.url), "config", "check")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("config check: %v\n%s\nwant it refused, saying %q", err, out, tc.want)
			} else if strings.Contains(err.Error()+out, password) {
				t.Errorf("config check prints the password: %v\n%s", err, out)
			}
			if err := serveRefusal(t, config, env(tc.url)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("serve: %v\nwant it refused, saying %q", err, tc.want)
			} else if strings.Contains(err.Error(), password) {
				t.Errorf("serve prints the password: %v", err)
			}
		})
	}
}
