package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// Open says at start what it runs with, so that an override from the
// environment can be confirmed, and never a secret; Addr and AdminAddr
// say where it listens; Close says when everything is stopped.
func TestOpenLogsWhatItRunsWith(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminAddr := ln.Addr().String()
	ln.Close()
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = %q\n[storage]\npath = %q\n[ocr]\nmodel = \"gemini-2.5-flash-lite\"\n"+minimal,
		adminAddr, filepath.Join(dir, "bw.db")))
	secrets := map[string]string{"GEMINI_API_KEY": "gemini-secret-value", "BREAKWATER_ADMIN_TOKEN": "admin-secret-value"}
	cfg, err := Load(path, env(secrets))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	a, err := Open(context.Background(), cfg, Options{Getenv: env(secrets), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + a.Addr() + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("healthz on Addr(): %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if a.AdminAddr() != adminAddr {
		t.Errorf("AdminAddr() = %q, want %q", a.AdminAddr(), adminAddr)
	}
	a.Close()
	out := logs.String()
	for _, want := range []string{"model=gemini-2.5-flash-lite", "base_url=https://generativelanguage.googleapis.com", "listen=127.0.0.1:0",
		"admin_listen=" + adminAddr, "storage=" + filepath.Join(dir, "bw.db"), "rate 60/1m0s", "plan free: quota 10/month",
		"stopped: every write is committed"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	a.Close() // a second Close does nothing, and says nothing
	if n := strings.Count(logs.String(), "stopped:"); n != 1 {
		t.Errorf("%d stop lines after two Closes, want 1", n)
	}
	for _, secret := range secrets {
		if strings.Contains(out, secret) {
			t.Errorf("the log shows a secret:\n%s", out)
		}
	}
}
