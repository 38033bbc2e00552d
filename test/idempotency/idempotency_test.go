// Package idempotency proves from outside the built binary that a read
// whose usage record was committed is never bought twice: the process is
// killed between the usage commit and the answer, and the client's retry
// with the same Idempotency-Key after the restart is the stored answer.
package idempotency

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"breakwater/test/harness"
)

func post(t *testing.T, addr, key, idem string, img []byte) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	req.Header.Set("Idempotency-Key", idem)
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func TestKilledAfterTheRecordTheRetryIsAReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := harness.Build(ctx, root, dir, "failpoint")
	if err != nil {
		t.Fatal(err)
	}
	gemini, err := harness.NewGemini(root, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer gemini.Close()
	config := filepath.Join(dir, "config.toml")
	if err := harness.WriteConfig(config, harness.Config{DBPath: filepath.Join(dir, "bw.db"), GeminiURL: gemini.URL, DailyRequests: 100, Plan: "free"}); err != nil {
		t.Fatal(err)
	}
	key, err := harness.CreateKey(ctx, bin, config, "ann", "free")
	if err != nil {
		t.Fatal(err)
	}
	img := harness.PNG()

	// The first attempt: the record is committed, then the process dies
	// before it answers.
	p, err := harness.Start(bin, config, filepath.Join(dir, "first.log"), "GEMINI_API_KEY=test", "BREAKWATER_FAILPOINT=recorded")
	if err != nil {
		t.Fatal(err)
	}
	if resp, body, err := post(t, p.Addr, key, "upload-1", img); err == nil && resp.StatusCode == http.StatusOK {
		t.Fatalf("the first attempt was answered (%s): the failpoint did not fire", body)
	}
	<-p.Done()
	if !p.Killed() {
		t.Fatalf("the server was not killed at the failpoint; log:\n%s", harness.Tail(p.LogPath))
	}
	_, calls := gemini.Calls()
	if calls != 1 {
		t.Fatalf("%d upstream calls for the first attempt, want 1", calls)
	}

	// The client's retry after the restart is answered from the record.
	p, err = harness.Start(bin, config, filepath.Join(dir, "second.log"), "GEMINI_API_KEY=test")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(15 * time.Second)
	resp, body, err := post(t, p.Addr, key, "upload-1", img)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %v %v %s, want the stored answer replayed", resp, err, body)
	}
	if _, after := gemini.Calls(); after != 1 {
		t.Errorf("%d upstream calls after the retry, want still 1", after)
	}
}
