package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// build compiles pkg (relative to the module root repo) into dir/name.
func build(ctx context.Context, repo, pkg, dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// servingLine matches the line both servers log once they listen
// (log/slog's text format), and captures the address.
var servingLine = regexp.MustCompile(`msg="(?:gateway|floor) serving" addr=(http://127\.0\.0\.1:\d+)`)

// process is a server the generator started: the gateway or the floor. It
// owns one goroutine, which reads the server's log and then reaps it.
// adminLine matches the gateway's admin listener line (Go's profiles and
// its metrics), when it has one (-admin-addr).
var adminLine = regexp.MustCompile(`msg="admin listener" addr=(http://127\.0\.0\.1:\d+)`)

type process struct {
	name string
	cmd  *exec.Cmd
	addr string // http://127.0.0.1:PORT
	pid  int

	mu         sync.Mutex
	admin      string   // http://127.0.0.1:PORT of the admin listener, if any
	tail       []string // the last lines of its log
	errorLines int      // lines at level=ERROR
	warnLines  int      // lines at level=WARN

	exited  chan struct{} // closed once reaped
	waitErr error         // valid after exited
}

const tailLines = 40

// startProcess runs bin with args and waits (at most timeout) for its
// serving line.
func startProcess(name, bin string, args []string, timeout time.Duration) (*process, error) {
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = nil // both servers log to stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			p.record(line)
			if !sent {
				if m := servingLine.FindStringSubmatch(line); m != nil {
					addr <- m[1]
					sent = true
				}
			}
		}
		p.waitErr = cmd.Wait() // after every read of the pipe, as exec requires
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case p.addr = <-addr:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before serving (%v); log:\n%s", name, p.waitErr, p.logTail())
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-p.exited
		return nil, fmt.Errorf("%s did not log its serving line within %s; log:\n%s", name, timeout, p.logTail())
	}
}

func (p *process) record(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := adminLine.FindStringSubmatch(line); m != nil {
		p.admin = m[1]
	}
	switch {
	case strings.Contains(line, "level=ERROR"):
		p.errorLines++
	case strings.Contains(line, "level=WARN"):
		p.warnLines++
	}
	if len(p.tail) == tailLines {
		copy(p.tail, p.tail[1:])
		p.tail = p.tail[:tailLines-1]
	}
	p.tail = append(p.tail, line)
}

// adminURL is the admin listener's base URL, "" without one.
func (p *process) adminURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admin
}

func (p *process) logTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *process) logCounts() (errs, warns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errorLines, p.warnLines
}

// stop interrupts the server, gives it timeout to shut down, then kills
// it. It reports a non-zero exit as an error.
func (p *process) stop(timeout time.Duration) error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s had already exited: %v", p.name, p.waitErr)
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s: killed", p.name, timeout)
	}
	if p.waitErr != nil {
		return fmt.Errorf("%s exited: %w; log:\n%s", p.name, p.waitErr, p.logTail())
	}
	return nil
}

// supportsFlag reports whether bin's usage names flag.
func supportsFlag(bin, flag string) bool {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	return strings.Contains(string(out), "-"+flag+" ")
}

// Check is the result of `gateway check -db` on a scenario's database.
type Check struct {
	OK     bool   `json:"ok"`
	Output string `json:"output,omitempty"`
}

// runCheck audits db with the gateway's own checker.
func runCheck(ctx context.Context, bin, db string) Check {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "check", "-db", db).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			text = strings.TrimSpace(text + "\n" + err.Error())
		}
		return Check{OK: false, Output: text}
	}
	return Check{OK: true, Output: text}
}
