package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fenced-dev/fenced/drivertest"
)

const serveSecret = "3b0f6c1d9a8e7f60b5c4d3e2f1a09876"

// startServe starts `fenced serve` on a free loopback port with an admin
// token file and returns its base URL.
func startServe(t *testing.T, store string, args ...string) string {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "admin")
	if err := os.WriteFile(tokens, []byte("alice "+serveSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--addr", "127.0.0.1:0", "--admin-token-file", tokens, "--poll", "200ms"}, args...)...)
	cmd.Env = append(os.Environ(), "FENCED_TEST_AS_CLI=1", "FENCED_STORE="+store)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errs := &syncBuffer{}
	cmd.Stderr = errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("fenced serve did not stop on SIGTERM")
		}
		if t.Failed() {
			t.Logf("fenced serve's stderr:\n%s", errs)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("fenced serve printed no address (%v); stderr:\n%s", err, errs)
	}
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("fenced serve said %q", line)
	}
	go io.Copy(io.Discard, out)
	return m[1]
}

func httpDo(t *testing.T, method, url, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// browser starts headless Chromium (Debian's chromium) under chromedp. A
// missing chromium fails the test: scripts/test.sh installs it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (apt-get install chromium, or run scripts/test.sh): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1200, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// in runs action in the browser, failing the test after 30s.
func in[T any](t *testing.T, ctx context.Context, what string, action chromedp.Action[T]) T {
	t.Helper()
	return inFor(t, ctx, what, 30*time.Second, action)
}

// inFor is in with a hang guard of its own.
func inFor[T any](t *testing.T, ctx context.Context, what string, guard time.Duration, action chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, guard)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// shoot saves a screenshot under docs/ when FENCED_SCREENSHOTS is set (to
// refresh the committed ones), and in the test's temp dir otherwise.
func shoot(t *testing.T, name string, png []byte) {
	t.Helper()
	dir := t.TempDir()
	if os.Getenv("FENCED_SCREENSHOTS") != "" {
		dir = filepath.Join("..", "..", "docs")
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The "done when", end to end with real processes and a real
// browser: fenced serve over a SQLite file and a fenced run holding KEY;
// the API lists KEY with its fence, /metrics has the store gauges, a break
// without a token gets 401 and changes nothing; headless Chromium renders
// the dashboard with KEY, its time-left bar moves, the explorer's numbers
// follow its sliders, the timeline draws a real run of the billing
// scenario, and a break through the page with the token ends the holder
// with exit 77.
func TestServeDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("long: the dashboard in headless Chromium; run without -short")
	}
	store := tempStore(t)
	base := startServe(t, store)
	const key = "invoice:inv_72"
	// The holder must outlast the page's steps with Chromium loading the
	// machine (a 3s TTL was lost to a late renewal under load, taking the
	// row and its break form with it): a TTL this machine renews in time,
	// at least 20s.
	ttl := drivertest.StoreTTL(t, store, 2, 20*time.Second)
	run, _, runErr := startRun(t, store, "run", "--ttl", ttl.String(), key, "--", "sleep", "120")
	info := waitHeld(t, client(t, store), key)

	code, body := httpDo(t, "GET", base+"/api/v1/leases", "", "")
	if code != 200 || !strings.Contains(body, `"key": "`+key+`"`) || !strings.Contains(body, fmt.Sprintf(`"fence": %d`, info.Fence)) {
		t.Fatalf("GET /api/v1/leases: %d %s", code, body)
	}
	code, body = httpDo(t, "GET", base+"/metrics", "", "")
	if code != 200 || !strings.Contains(body, `fenced_store_leases_held{key_group="invoice"} 1`) || !strings.Contains(body, `fenced_store_leases_expiring{key_group="invoice"}`) {
		t.Fatalf("GET /metrics: %d, no store gauges:\n%s", code, body)
	}
	code, body = httpDo(t, "POST", base+"/api/v1/leases/"+key+"/break", `{"reason":"no token"}`, "")
	if code != 401 {
		t.Fatalf("break without a token: %d %s", code, body)
	}
	if now := waitHeld(t, client(t, store), key); now.Fence != info.Fence {
		t.Fatalf("the refused break changed the lease: fence %d → %d", info.Fence, now.Fence)
	}

	ctx := browser(t)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	row := `tr.lease[data-key="` + key + `"]`
	in(t, ctx, "dashboard", chromedp.Steps(chromedp.Navigate(base+"/"), chromedp.WaitVisible(css(row))))
	if fence := in(t, ctx, "fence cell", chromedp.Text(css(row+" td.fence"))); fence != strconv.FormatUint(info.Fence, 10) {
		t.Fatalf("dashboard shows fence %q, want %d", fence, info.Fence)
	}

	// The bar moves: its value changes as time passes.
	var values []float64
	for i := 0; i < 6; i++ {
		values = append(values, in(t, ctx, "bar", chromedp.Evaluate[float64](`document.querySelector('`+row+` progress.bar').value`)))
		time.Sleep(250 * time.Millisecond)
	}
	moved, down := false, false
	for i := 1; i < len(values); i++ {
		moved = moved || values[i] != values[0]
		down = down || values[i] < values[i-1]
	}
	if !moved || !down || values[0] <= 0 {
		t.Fatalf("time-left bar values %v: want a bar that moves down", values)
	}
	shoot(t, "dashboard.png", in(t, ctx, "screenshot", chromedp.FullScreenshot(100)))

	// The explorer follows its sliders: a 60s TTL renewed at a third
	// absorbs 60s − 602ms − 20s; a 45s freeze then leaves a 5s stale window.
	slide := func(id string, v int) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const s = document.querySelector('#%s'); s.value = %d; s.dispatchEvent(new Event('input')); })()`, id, v))
	}
	until := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(10*time.Second))
	}
	in(t, ctx, "TTL slider", chromedp.Steps(slide("ttl", 60000), until(`document.querySelector('#freeze-absorbed').textContent === '39.4s'`)))
	in(t, ctx, "freeze slider", chromedp.Steps(slide("pause", 45000), until(`document.querySelector('#stale-window').textContent === '5s'`)))
	if class := in(t, ctx, "stale window", chromedp.AttributeValue(css("#stale-window"), "class")); class.Value != "bad" {
		t.Fatalf("stale window shown as %q, want it marked bad", class.Value)
	}
	shoot(t, "dashboard-explorer.png", in(t, ctx, "screenshot", chromedp.Screenshot(css("#explorer"), chromedp.NodeVisible)))

	// The timeline draws a real run of the billing scenario: on a busy
	// machine, after up to two more runs with longer TTLs (as fenced
	// demo), so its hang guard is longer than a step's.
	inFor(t, ctx, "scenario", 3*time.Minute, chromedp.Steps(
		chromedp.SendKeys(css("#token"), serveSecret),
		chromedp.Click(css("#run-fenced")),
		chromedp.WaitVisible(css("#timeline .refused-mark"))))
	verdict := in(t, ctx, "verdict", chromedp.Text(css("#verdict")))
	lanes := in(t, ctx, "lanes", chromedp.Evaluate[int](`document.querySelectorAll('#timeline text.lane').length`))
	grants := in(t, ctx, "grants", chromedp.Evaluate[int](`document.querySelectorAll('#timeline .grant-bar').length`))
	sent := in(t, ctx, "sent", chromedp.Evaluate[int](`document.querySelectorAll('#timeline .sent-mark').length`))
	if !strings.HasPrefix(verdict, "OK: exactly one invoice sent") || lanes != 3 || grants < 2 || sent != 1 {
		t.Fatalf("timeline: verdict %q, %d lanes, %d grants, %d sent", verdict, lanes, grants, sent)
	}
	shoot(t, "dashboard-scenario.png", in(t, ctx, "screenshot", chromedp.Screenshot(css("#scenario"), chromedp.NodeVisible)))

	// A break through the page, with the token, ends the holder: exit 77.
	// The table refreshes every second meanwhile, and must leave the form
	// being typed in alone.
	in(t, ctx, "break form", chromedp.Steps(
		chromedp.Click(css(row+" button.break")),
		chromedp.WaitVisible(css("tr.break-form .reason")),
		chromedp.SendKeys(css("tr.break-form .reason"), "browser test: ")))
	time.Sleep(1500 * time.Millisecond)
	if focused := in(t, ctx, "focus", chromedp.Evaluate[bool](`document.activeElement.classList.contains('reason') && document.activeElement.value === 'browser test: '`)); !focused {
		t.Fatal("the break form lost its focus or its text when the table refreshed")
	}
	in(t, ctx, "break", chromedp.Steps(
		chromedp.SendKeys(css("tr.break-form .reason"), "worker wedged"),
		chromedp.Click(css("tr.break-form .confirm-break")),
		until(`document.querySelector('#message').textContent.startsWith('Broke ')`)))
	if message := in(t, ctx, "message", chromedp.Text(css("#message"))); !strings.Contains(message, key) || !strings.Contains(message, "http:alice") {
		t.Fatalf("page says %q", message)
	}
	if code := waitExit(t, run, 20*time.Second); code != exitLost {
		t.Fatalf("fenced run exited %d after the break, want %d; stderr:\n%s", code, exitLost, runErr)
	}
	if !strings.Contains(runErr.String(), "http:alice") {
		t.Errorf("fenced run's loss message does not say who broke the lease:\n%s", runErr)
	}
	recs, err := client(t, store).Breaks(context.Background(), key)
	if err != nil || len(recs) != 1 || recs[0].By != "http:alice" || recs[0].Reason != "browser test: worker wedged" {
		t.Fatalf("audit: %+v %v", recs, err)
	}
}

// TestServeHelpListsEveryPage checks that serve --help names the pages and
// API paths the server has, the partition ones included.
func TestServeHelpListsEveryPage(t *testing.T) {
	t.Parallel()
	r := cli(t, tempStore(t), "serve", "--help")
	for _, path := range []string{"/api/v1/leases/KEY/break", "/keys/KEY", "/partitions/GROUP", "/api/v1/partitions/GROUP", "/api/v1/plan", "/api/v1/scenario", "/metrics", "/healthz"} {
		if !strings.Contains(r.stdout, path) {
			t.Errorf("serve --help does not name %s:\n%s", path, r.stdout)
		}
	}
}
