//go:build linux

package supervise

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ModeEnv is the environment variable that, set to "proctree" in a
// supervisor's environment, makes Start skip the cgroup. Start then uses
// the process-tree walk, as if no cgroup could be made. It exists so tests
// can exercise the fallback on a machine that allows cgroups. Nothing else
// should set it.
const ModeEnv = "FENCED_SUPERVISE_MODE"

// cgroup is a cgroup v2 directory of the supervisor's own, holding the
// command's whole tree, and every cgroup the command makes inside it.
type cgroup struct {
	dir  string // its directory in the cgroup2 mount
	path string // its path in the hierarchy, as /proc/PID/cgroup shows it; "" in the guard
}

var cgroupSeq atomic.Int64

// maxCgroupTries bounds the names newCgroup skips because they are taken.
const maxCgroupTries = 100

// newCgroup makes a cgroup v2 child of the cgroup this process runs in.
// It fails, changing nothing, where cgroup v2 is not mounted, the process
// may not create a child cgroup (no permission, no delegation), or the
// kernel lacks cgroup.kill (before 5.14).
func newCgroup() (*cgroup, error) {
	mount, root, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	rel, ok := strings.CutPrefix(own, root)
	if !ok {
		return nil, fmt.Errorf("own cgroup %s is outside the cgroup2 mount's root %s", own, root)
	}
	// A name taken is skipped: a fenced killed with -9 leaves its empty
	// cgroup behind, and a later process may get its process ID.
	var name, dir string
	for tries := 0; ; tries++ {
		name = fmt.Sprintf("fenced-%d-%d", os.Getpid(), cgroupSeq.Add(1))
		dir = filepath.Join(mount, rel, name)
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || tries == maxCgroupTries {
			return nil, err
		}
	}
	c := &cgroup{dir: dir, path: filepath.Join(own, name)}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("%s has no cgroup.kill (kernel before 5.14)", dir)
	}
	return c, nil
}

// cgroup2Mount finds the cgroup2 mount in /proc/self/mountinfo and returns
// its mount point and the cgroup path it shows (its root).
func cgroup2Mount() (mount, root string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) >= 5 && len(qf) >= 1 && qf[0] == "cgroup2" {
			return unescapeMount(pf[4]), unescapeMount(pf[3]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", errors.New("no cgroup2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup returns this process's cgroup v2 path ("0::/path").
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process is in no cgroup v2 hierarchy")
}

// openDir opens the cgroup's directory for CLONE_INTO_CGROUP.
func (c *cgroup) openDir() (int, error) {
	return unix.Open(c.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

func (c *cgroup) write(file, value string) error {
	return os.WriteFile(filepath.Join(c.dir, file), []byte(value), 0)
}

// kill sends SIGKILL to every process in the cgroup, in one step that no
// fork can escape.
func (c *cgroup) kill() error { return c.write("cgroup.kill", "1") }

// freeze freezes (or thaws) every process in the cgroup, including those
// forked while it freezes, and waits up to d for the freeze to complete.
func (c *cgroup) freeze(on bool, d time.Duration) error {
	v := "0"
	if on {
		v = "1"
	}
	if err := c.write("cgroup.freeze", v); err != nil {
		return err
	}
	for deadline := time.Now().Add(d); c.event("frozen") != on; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not frozen=%v after %v", c.dir, on, d)
		}
	}
	return nil
}

// populated reports whether any process is left in the cgroup. It reports
// true if cgroup.events cannot be read while the directory exists.
func (c *cgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.events"))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return strings.Contains(string(b), "populated 1")
}

// event reports whether cgroup.events says "key 1".
func (c *cgroup) event(key string) bool {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.events"))
	return err == nil && strings.Contains(string(b), key+" 1")
}

// members lists the processes in the cgroup and in every cgroup nested in
// it (the command may make its own and move there), one thread id for
// each (kill on a thread id signals its whole process). It reads
// cgroup.threads, not cgroup.procs: a process whose main thread exited
// (pthread_exit) while others run is missing from cgroup.procs, and
// cgroup.kill misses it too, but its threads are listed.
func (c *cgroup) members() []int {
	seen := map[int]bool{}
	var out []int
	for _, dir := range c.dirs() {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.threads"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			tid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			tgid := threadGroup(tid)
			if tgid == 0 || seen[tgid] {
				continue
			}
			seen[tgid] = true
			out = append(out, tid)
		}
	}
	return out
}

// dirs returns the cgroup's directory and every cgroup directory nested in
// it, each before the ones inside it. A directory removed while it reads
// is left out.
func (c *cgroup) dirs() []string {
	var out []string
	_ = filepath.WalkDir(c.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile: neither it nor what it held is left
		}
		if d.IsDir() {
			out = append(out, path)
		}
		return nil
	})
	return out
}

// holds reports whether process p is in the cgroup or in a cgroup nested
// in it; ok is false if p is gone. A process whose main thread exited
// (pthread_exit) keeps showing, in /proc/PID/cgroup, the cgroup its main
// thread died in, wherever its living threads move since: then the
// living threads' cgroups are read instead.
func (c *cgroup) holds(p proc) (in, ok bool) {
	pid := strconv.Itoa(p.pid)
	if p.state != 'Z' && p.state != 'X' {
		return c.holdsFile("/proc/" + pid + "/cgroup")
	}
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		return false, false
	}
	for _, e := range tasks {
		st, err := os.ReadFile("/proc/" + pid + "/task/" + e.Name() + "/stat")
		if i := bytes.LastIndexByte(st, ')'); err != nil || i < 0 || i+2 >= len(st) || st[i+2] == 'Z' || st[i+2] == 'X' {
			continue
		}
		if in, found := c.holdsFile("/proc/" + pid + "/task/" + e.Name() + "/cgroup"); found {
			if !in {
				return false, true
			}
			ok = true
		}
	}
	return ok, ok
}

// holdsFile reports whether the cgroup file of a process or thread
// (/proc/PID/cgroup) names this cgroup or one nested in it; ok is false
// if it cannot be read.
func (c *cgroup) holdsFile(file string) (in, ok bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, found := strings.CutPrefix(line, "0::"); found {
			return p == c.path || strings.HasPrefix(p, c.path+"/"), true
		}
	}
	return false, true
}

// adopt moves process pid (all its threads) into the cgroup.
func (c *cgroup) adopt(pid int) error {
	return c.write("cgroup.procs", strconv.Itoa(pid))
}

// threadGroup returns the process (thread group) id of thread tid, or 0
// if it is gone.
func threadGroup(tid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// killAll sends SIGKILL to every process in the cgroup: cgroup.kill, which
// no fork escapes, and each member, which reaches a process cgroup.kill
// misses (see members). It returns how many processes it found.
func (c *cgroup) killAll() int {
	m := c.members()
	_ = c.kill()
	for _, tid := range m {
		_ = unix.Kill(tid, syscall.SIGKILL)
	}
	return len(m)
}

// remove removes the cgroup, and every cgroup nested in it (deepest
// first: a cgroup with a child cannot be removed), once they are empty,
// trying for up to d (the kernel may take a moment to drop dead tasks).
func (c *cgroup) remove(d time.Duration) error {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		dirs := c.dirs()
		var err error
		for i := len(dirs) - 1; i >= 0 && err == nil; i-- {
			if e := unix.Rmdir(dirs[i]); e != nil && !errors.Is(e, syscall.ENOENT) {
				err = fmt.Errorf("remove cgroup %s: %w", dirs[i], e)
			}
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
	}
}

// Probe says which supervision mode Start would use here: it makes (and
// removes) a cgroup, as Start would.
func Probe() string {
	if os.Getenv(ModeEnv) == "proctree" {
		return procTreeMode(ModeEnv + "=proctree")
	}
	c, err := newCgroup()
	if err != nil {
		return procTreeMode(err.Error())
	}
	_ = c.remove(time.Second)
	return cgroupMode(filepath.Dir(c.dir))
}

func cgroupMode(parent string) string {
	return "cgroup v2 (a cgroup of its own under " + parent +
		": cgroup.kill ends the whole tree, cgroup.freeze stops it; a process that moves to another cgroup is moved back)"
}

func procTreeMode(why string) string {
	return "process tree (no cgroup: " + why +
		"; processes found by walking /proc; a process that left the group survives a kill -9 of the supervisor)"
}
