package proof

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// workers is the bookkeeping both modes keep of a run's worker
// processes: each one's command, the channel closed once it has exited,
// and its proxies (when the nemesis cuts links in userspace).
type workers struct {
	dir string

	pmu     sync.Mutex
	procs   map[int]*exec.Cmd
	exited  map[int]chan struct{}
	proxies map[int][]*proxy
	wg      sync.WaitGroup
}

func newWorkers(dir string) workers {
	return workers{dir: dir, procs: map[int]*exec.Cmd{}, exited: map[int]chan struct{}{}, proxies: map[int][]*proxy{}}
}

// proxied returns store with every address behind a new proxy of worker
// i, closing the proxies i had (a restarted worker gets new ones).
func (ws *workers) proxied(i int, store string) (string, error) {
	for _, p := range ws.proxies[i] {
		p.close()
	}
	ws.proxies[i] = nil
	return proxyURL(store, func(hp string) (string, error) {
		p, err := startProxy(hp)
		if err != nil {
			return "", err
		}
		ws.proxies[i] = append(ws.proxies[i], p)
		return p.addr(), nil
	})
}

// start starts cmd as worker i, with its output in the run directory's
// worker-i.log, killed if the controller dies, after place (nil for none)
// put it where it runs.
func (ws *workers) start(i int, cmd *exec.Cmd, place func()) error {
	logf, err := os.OpenFile(filepath.Join(ws.dir, fmt.Sprintf("worker-%d.log", i)), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if place != nil {
		place()
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("proof: start worker %d: %w", i, err)
	}
	exited := make(chan struct{})
	ws.pmu.Lock()
	ws.procs[i], ws.exited[i] = cmd, exited
	ws.pmu.Unlock()
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	return nil
}

// worker returns worker i's command and the channel closed once it has
// exited.
func (ws *workers) worker(i int) (*exec.Cmd, chan struct{}) {
	ws.pmu.Lock()
	defer ws.pmu.Unlock()
	return ws.procs[i], ws.exited[i]
}

func (ws *workers) closeProxies() {
	for _, ps := range ws.proxies {
		for _, p := range ps {
			p.close()
		}
	}
}

// stop asks workers 0..n-1 to finish their round and exit (the stop
// file), continuing any the nemesis stopped, and kills the ones still
// running after bound.
func (ws *workers) stop(n int, bound time.Duration, logf func(string, ...any)) {
	os.WriteFile(filepath.Join(ws.dir, stopFile), nil, 0o644)
	deadline := time.After(bound)
	for i := range n {
		cmd, exited := ws.worker(i)
		if cmd == nil {
			continue
		}
		cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-exited:
		case <-deadline:
			logf("proof: worker %d did not stop; killed", i)
			cmd.Process.Kill()
			<-exited
		}
	}
	ws.wg.Wait()
}
