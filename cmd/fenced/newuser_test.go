package main

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// cliDefault runs the CLI with neither --store nor FENCED_STORE, its
// default store in a temporary state directory.
func cliDefault(t *testing.T, state string, args ...string) result {
	t.Helper()
	cmd, out, errb := cliCmd(t, "", args...)
	cmd.Env = append(cmd.Env, "XDG_STATE_HOME="+state)
	_ = cmd.Run()
	return result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
}

func TestImplicitDefaultStoreIsNamedOnce(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	r := cliDefault(t, state, "ls")
	if r.code != 0 {
		t.Fatalf("ls: exit %d, stderr %s", r.code, r.stderr)
	}
	if n := strings.Count(r.stderr, "no store chosen"); n != 1 || !strings.Contains(r.stderr, state) ||
		!strings.Contains(r.stderr, "--store or FENCED_STORE") || !strings.Contains(r.stderr, "--quiet") {
		t.Fatalf("ls on the implicit default store: stderr %q, want one note naming %s, --store or FENCED_STORE and --quiet", r.stderr, state)
	}
	if !strings.HasPrefix(r.stdout, "store: sqlite://"+state+"/fenced/fenced.db (the default, per user)\n") {
		t.Fatalf("ls output does not begin with the store: %q", r.stdout)
	}
	// elect runs a command under the default store; the note is still once.
	if r := cliDefault(t, state, "elect", "svc", "--", "true"); strings.Count(r.stderr, "no store chosen") != 1 {
		t.Fatalf("elect: exit %d, stderr %q, want the note once", r.code, r.stderr)
	}
	if r := cliDefault(t, state, "--quiet", "ls"); r.code != 0 || r.stderr != "" {
		t.Fatalf("ls --quiet: exit %d, stderr %q, want nothing", r.code, r.stderr)
	}
	if r := cliDefault(t, state, "-q", "inspect", "svc"); r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "store:") {
		t.Fatalf("inspect -q: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	// Chosen stores, by flag or environment, are not remarked on.
	store := tempStore(t)
	if r := cliDefault(t, state, "--store", store, "ls"); r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "store: "+store+"\n") {
		t.Fatalf("ls --store: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	if r := cli(t, store, "inspect", "nothing:here"); strings.Contains(r.stderr, "no store chosen") {
		t.Fatalf("FENCED_STORE set, yet: %q", r.stderr)
	}
}

func TestInspectAndObserveNameTheStore(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	if r := cli(t, store, "run", "k", "--", "true"); r.code != 0 {
		t.Fatalf("run: exit %d, %s", r.code, r.stderr)
	}
	began := time.Now()
	r := cli(t, store, "inspect", "k")
	if r.code != 0 || !strings.Contains(r.stdout, "store:") || !strings.Contains(r.stdout, store) {
		t.Fatalf("inspect: exit %d, stdout %q, want a store line naming %s", r.code, r.stdout, store)
	}
	// observe prints its header once it has opened the store, as inspect
	// did: 10 s, or five of inspect's whole runs on this machine as busy
	// as it is now (under the hog one took over 2 s), if longer.
	bound := max(10*time.Second, 5*time.Since(began))
	obs, out, _ := startRun(t, store, "observe", "k")
	eventually(t, bound, fmt.Sprintf("observe printed no store header (bound %v)", bound.Round(time.Millisecond)), func() bool {
		return strings.HasPrefix(out.String(), "store: "+store+"\n")
	})
	_ = obs.Process.Kill()
	// A password in the store URL is not printed, not even in the error.
	r = cli(t, "postgres://app:s3cret@127.0.0.1:1/db?connect_timeout=1", "ls")
	if strings.Contains(r.stdout+r.stderr, "s3cret") {
		t.Fatalf("the password was printed: %q %q", r.stdout, r.stderr)
	}
}

// TestProofOnRedisNamesTheFlagAndWarnsOfNoPersistence runs fenced proof
// on a Redis without persistence with the default (strict) fence: it is
// refused at once, naming the CLI flag (not the Go option), and it warns
// that fences can repeat after the server restarts. A Redis with
// appendonly yes and appendfsync always gets no warning.
func TestProofOnRedisNamesTheFlagAndWarnsOfNoPersistence(t *testing.T) {
	t.Parallel()
	bare := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true}).URL()
	r := cli(t, bare, "proof", "--quick")
	if r.code != exitUsage {
		t.Fatalf("proof on Redis with a strict fence: exit %d, want %d; stderr %s", r.code, exitUsage, r.stderr)
	}
	if !strings.Contains(r.stderr, "--min-fence=repeatable") || strings.Contains(r.stderr, "FenceRepeatable") {
		t.Fatalf("proof's refusal does not name --min-fence=repeatable (or names the Go option): %s", r.stderr)
	}
	if !strings.Contains(r.stderr, "warning: this Redis keeps no data across a restart") || !strings.Contains(r.stderr, "fences can repeat") {
		t.Fatalf("no warning that fences can repeat after a restart: %s", r.stderr)
	}
	for _, args := range [][]string{{"run", "k", "--", "true"}, {"elect", "k", "--", "true"}} {
		r := cli(t, bare, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--min-fence=repeatable") || strings.Contains(r.stderr, "FenceRepeatable") {
			t.Fatalf("%s on Redis with a strict fence: exit %d, stderr %s; want %d naming --min-fence=repeatable, not the Go option", args[0], r.code, r.stderr, exitUsage)
		}
	}
	durable := testenv.StartRedis(t, testenv.RedisConfig{}).URL()
	if r := cli(t, durable, "proof", "--quick"); r.code != exitUsage || strings.Contains(r.stderr, "warning") {
		t.Fatalf("proof on a durable Redis: exit %d, stderr %s; want the refusal without a warning", r.code, r.stderr)
	}
}

func TestPlanRoundsDurations(t *testing.T) {
	t.Parallel()
	r := cli(t, tempStore(t), "plan", "--ttl", "10s", "--max-pause", "7s")
	if r.code != 0 {
		t.Fatalf("plan: exit %d, %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "renewed every 3.333s") || strings.Contains(r.stdout, "3333333") || strings.Contains(r.stdout, "6666666") {
		t.Fatalf("plan prints unrounded durations:\n%s", r.stdout)
	}
}

// TestErrorsNameTheKeyOnce checks that a refused or interrupted acquire
// names its key once (it said acquire "k": k: lease held…).
func TestErrorsNameTheKeyOnce(t *testing.T) {
	store := tempStore(t)
	holder, hout, _ := startRun(t, store, "run", "job:dup", "--", "sh", "-c", "echo in; exec sleep 60")
	defer holder.Process.Kill()
	eventually(t, 10*time.Second, "the holder did not start", func() bool { return strings.Contains(hout.String(), "in") })
	refusedAt := time.Now()
	r := cli(t, store, "run", "job:dup", "--", "true")
	// A refused run starts, asks once and exits: a waiting run is waiting
	// well within twice that time on this machine, as busy as it is now.
	settle := 2*time.Since(refusedAt) + 500*time.Millisecond
	if r.code != exitHeld || strings.Count(r.stderr, "job:dup") != 1 || !strings.Contains(r.stderr, "lease held by another owner") {
		t.Fatalf("refused run: exit %d, stderr %q; want exit %d naming job:dup once", r.code, r.stderr, exitHeld)
	}
	for _, args := range [][]string{{"run", "--wait", "1m", "job:dup", "--", "true"}, {"elect", "job:dup", "--", "true"}} {
		w, _, werr := startRun(t, store, args...)
		time.Sleep(settle) // waiting now (the interrupt is named at any stage)
		_ = w.Process.Signal(syscall.SIGTERM)
		_ = w.Wait()
		if s := werr.String(); strings.Count(s, "job:dup") != 1 || !strings.Contains(s, "interrupted") {
			t.Fatalf("%s interrupted while waiting: stderr %q, want job:dup named once", args[0], s)
		}
	}
}

func TestDemoRefusesStore(t *testing.T) {
	t.Parallel()
	r := cli(t, "", "demo", "--store", "postgres://app:s3cret@127.0.0.1:1/db")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--store") || !strings.Contains(r.stderr, "fenced proof") || strings.Contains(r.stderr, "s3cret") {
		t.Fatalf("demo --store: exit %d, stderr %q; want exit %d naming --store and fenced proof, password redacted", r.code, r.stderr, exitUsage)
	}
}

// TestDashboardAtANarrowWindow renders the dashboard in headless Chromium
// 700px wide: the Break button is inside the viewport and inside its own
// cell (a fixed-width column clipped it), the page does not scroll
// sideways, every time on both pages has one format, and the key page
// links back to the list.
func TestDashboardAtANarrowWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("long: the dashboard in headless Chromium at 700px; run without -short")
	}
	store := tempStore(t)
	base := startServe(t, store)
	const key = "invoice:inv_72-with-a-rather-long-key-name"
	startRun(t, store, "run", "--ttl", "30s", key, "--", "sleep", "60")
	waitHeld(t, client(t, store), key)
	if r := cli(t, store, "break", key, "--reason", "narrow window test"); r.code != 0 {
		t.Fatalf("break: exit %d, %s", r.code, r.stderr)
	}
	startRun(t, store, "run", "--ttl", "30s", key, "--", "sleep", "60")
	eventually(t, 10*time.Second, "the key was not taken again", func() bool {
		i, err := client(t, store).Inspect(context.Background(), key)
		return err == nil && i.Held
	})
	ctx := browser(t)
	row := `tr.lease[data-key="` + key + `"]`
	in(t, ctx, "dashboard at 700px", chromedp.Steps(
		chromedp.EmulateViewport(700, 900),
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(row))))
	time.Sleep(1500 * time.Millisecond) // the table refreshed once from the API
	layout := in(t, ctx, "layout", chromedp.Evaluate[map[string]float64](`(() => {
		const b = document.querySelector('`+row+` button.break').getBoundingClientRect();
		const td = document.querySelector('`+row+` td.actions').getBoundingClientRect();
		return {right: b.right, left: b.left, tdRight: td.right, tdLeft: td.left, width: window.innerWidth,
			scroll: document.documentElement.scrollWidth};
	})()`))
	if layout["right"] > layout["width"] || layout["right"] > layout["tdRight"]+0.5 || layout["left"] < layout["tdLeft"]-0.5 || layout["scroll"] > layout["width"] {
		t.Fatalf("at 700px the Break button is clipped or the page scrolls sideways: %v", layout)
	}
	shoot(t, "dashboard-narrow.png", in(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
	stamp := regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`)
	since := in(t, ctx, "held since", chromedp.Text(chromedp.CSS(row+" td.since")))
	if !stamp.MatchString(since) {
		t.Fatalf("held since %q, want the one date format (2006-01-02 15:04:05 UTC)", since)
	}
	in(t, ctx, "key page", chromedp.Steps(
		chromedp.Navigate(base+"/keys/"+url.PathEscape(key)),
		chromedp.WaitVisible(chromedp.CSS("#since"))))
	back := in(t, ctx, "back link", chromedp.Evaluate[string](`(() => { const a = document.querySelector('a.back'); return a ? a.getAttribute('href') + ' ' + a.textContent : ''; })()`))
	if !strings.HasPrefix(back, "/ ") {
		t.Fatalf("the key page has no link back to the list (a.back): %q", back)
	}
	time.Sleep(1500 * time.Millisecond)
	times := in(t, ctx, "times", chromedp.Evaluate[[]string](`[document.querySelector('#since').textContent,
		...[...document.querySelectorAll('#history-rows td:nth-child(3), #history-rows td:nth-child(4), #break-rows td:nth-child(1)')].map((td) => td.textContent)]`))
	if len(times) < 3 {
		t.Fatalf("key page shows too few times: %q", times)
	}
	for _, s := range times {
		if !stamp.MatchString(s) {
			t.Fatalf("key page times %q: want each in one format (2006-01-02 15:04:05 UTC)", times)
		}
	}
}
