package app

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// snippet returns the fenced block after `<!-- snippet: name -->` in
// docs/ROUTES.md: the proxy tests run the snippets users copy.
func snippet(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "ROUTES.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- snippet: " + regexp.QuoteMeta(name) + " -->\n```[a-z]*\n(.*?)```")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/ROUTES.md has no snippet %q", name)
	}
	return string(m[1])
}

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// binary finds a proxy's binary; a missing one fails the test (CI
// installs it: .ci/run).
func binary(t *testing.T, name string, dirs ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range dirs {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	t.Fatalf("%s is not installed: .ci/run installs Debian's package", name)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// startProxy runs cmd, in a process group of its own (nginx forks
// workers), until the test ends, and waits for addr to accept.
func startProxy(t *testing.T, addr string, cmd *exec.Cmd) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "output.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	output := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		out.Close()
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), output())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not listen on %s:\n%s", cmd.Path, addr, output())
}

const realProxyRoutes = `
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
identity = "user"
rate = 1
window = "1m"
burst = 0

[[routes]]
name = "referral"
methods = ["POST"]
path = "/api/referral/check"
upstream = "UPSTREAM"
identity = "ip"

[routes.fail]
statuses = [404]
limit = 2
`

// The README's proxy snippets, run by the real proxies: a request is
// allowed with the identity copied (a forged one dropped), the next is
// refused with 429 and its Retry-After reaching the client, and a
// fail-limited path goes through Breakwater to the app.
func TestRealProxies(t *testing.T) {
	for _, proxy := range []string{"caddy", "nginx"} {
		t.Run(proxy, func(t *testing.T) {
			up := referralApp(t)
			e := startRoutes(t, up.URL, realProxyRoutes)
			alice := e.key("alice")
			addr := startRealProxy(t, proxy, e, up.URL)
			base := "http://" + addr

			send := func(path, body string, h http.Header) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
				req.Header = h
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var b strings.Builder
				_, _ = io.Copy(&b, resp.Body)
				return resp, b.String()
			}
			auth := hdr("Authorization", "Bearer "+alice, "X-Breakwater-User", "mallory", "Content-Type", "application/json")
			if resp, body := send("/api/checkout", "{}", auth); resp.StatusCode != http.StatusCreated {
				t.Fatalf("allowed: %d %s", resp.StatusCode, body)
			}
			got := up.requests()
			if len(got) != 1 || got[0].header.Get("X-Breakwater-User") != "alice" || len(got[0].header.Values("X-Breakwater-User")) != 1 ||
				got[0].header.Get("X-Breakwater-Plan") != "free" {
				t.Fatalf("the app got %+v, want alice's identity only", got)
			}
			resp, body := send("/api/checkout", "{}", auth)
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "60" {
				t.Fatalf("refused: %d Retry-After %q %s, want 429 with Retry-After 60", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			if n := len(up.requests()); n != 1 {
				t.Fatalf("the refused request reached the app")
			}
			// A missing key is problem+json under nginx too, not its own
			// HTML page.
			if resp, body := send("/api/checkout", "{}", hdr()); resp.StatusCode != http.StatusUnauthorized ||
				!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") || !strings.Contains(body, `"status":401`) {
				t.Errorf("without credentials: %d %q %s, want 401 problem+json", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			// Through Breakwater's proxy: the fail limit sees the app's
			// answers.
			for i := range 2 {
				if resp, _ := send("/api/referral/check", referral("WRONG", "r@example.com"), hdr("Content-Type", "application/json")); resp.StatusCode != http.StatusNotFound {
					t.Fatalf("failure %d through Breakwater: %d", i, resp.StatusCode)
				}
			}
			if resp, _ := send("/api/referral/check", referral("RIGHT", "r@example.com"), hdr("Content-Type", "application/json")); resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("after the fail limit through Breakwater: %d, want 429", resp.StatusCode)
			}
		})
	}
}

// startRealProxy runs the README's snippet for proxy ("caddy" or "nginx")
// verbatim, in front of Breakwater (e) and the app at appURL, on a free
// loopback port, and returns that address.
func startRealProxy(t *testing.T, proxy string, e *routeEnv, appURL string) string {
	t.Helper()
	addr := freePort(t)
	r := strings.NewReplacer("127.0.0.1:8080", e.app.Addr(), "127.0.0.1:3000", strings.TrimPrefix(appURL, "http://"))
	conf := r.Replace(snippet(t, proxy))
	dir := t.TempDir()
	var cmd *exec.Cmd
	switch proxy {
	case "caddy":
		conf = "{\n\tadmin off\n\tauto_https off\n}\n" + strings.Replace(conf, "shop.example.com", "http://"+addr, 1)
		file := filepath.Join(dir, "Caddyfile")
		writeFile(t, file, conf)
		cmd = exec.Command(binary(t, "caddy"), "run", "--config", file, "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	case "nginx":
		conf = strings.Replace(conf, "listen 80;", "listen "+addr+";", 1)
		file := filepath.Join(dir, "nginx.conf")
		writeFile(t, file, "error_log "+dir+"/error.log;\nevents {}\nhttp {\n\taccess_log off;\n"+
			"\tclient_body_temp_path "+dir+"/body;\n\tproxy_temp_path "+dir+"/proxy;\n\tfastcgi_temp_path "+dir+"/fcgi;\n"+
			"\tuwsgi_temp_path "+dir+"/uwsgi;\n\tscgi_temp_path "+dir+"/scgi;\n"+conf+"}\n")
		cmd = exec.Command(binary(t, "nginx", "/usr/sbin"), "-p", dir, "-c", file, "-g", "daemon off; pid "+dir+"/nginx.pid;")
	default:
		t.Fatalf("no proxy %q", proxy)
	}
	startProxy(t, addr, cmd)
	return addr
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
