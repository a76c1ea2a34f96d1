// Package natstest runs a nats-server process of a test's own, which the
// test may stop and start again on the same port (to play a NATS restart).
// The shared server at GATEWAY_TEST_NATS_URL is never touched. For tests
// only.
package natstest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one nats-server on 127.0.0.1. Used by the test's goroutine.
type Server struct {
	t    testing.TB
	bin  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs nats-server (the binary on PATH, Debian package nats-server)
// on a free port and stops it when the test ends. Without the binary the
// test is skipped, or fails where GATEWAY_TEST_NATS_URL says NATS is part
// of the environment (CI installs the binary).
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		msg := "this test runs a nats-server of its own: apt-get install -y nats-server"
		if os.Getenv("GATEWAY_TEST_NATS_URL") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a port for NATS: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{t: t, bin: bin, port: port}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// Start runs the server (again) and waits, at most 10 s, until it greets
// a client.
func (s *Server) Start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-a", "127.0.0.1", "-p", fmt.Sprint(s.port))
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, io.Discard
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), time.Second)
		if err == nil {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "INFO ") {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("nats-server on port %d did not greet within 10s (%v)", s.port, err)
		}
		select {
		case <-s.done:
			s.t.Fatalf("nats-server on port %d exited at start (is the port taken?)", s.port)
		case <-time.After(20 * time.Millisecond): // polling the port, bounded by the deadline
		}
	}
}

// Pause stops the server's process (SIGSTOP) without closing anything:
// clients stay connected and their messages wait, as in a stall of NATS,
// until Resume. Stop ends a paused server too.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pause nats-server: %v", err)
	}
}

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resume nats-server: %v", err)
	}
}

// Stop kills the server and waits for it; safe to call when stopped.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.t.Errorf("nats-server did not exit 10s after SIGKILL")
	}
	s.cmd = nil
}
