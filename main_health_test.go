package main

// `gateway health` against the real binary: ready, stuck (frozen), not
// ready (draining for a stop), stopped, and bad flags.

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestHealthOfTheRunningServer(t *testing.T) {
	srv := startProcess(t, filepath.Join(t.TempDir(), "gw.db"), "5ms")
	hostPort := strings.TrimPrefix(srv.base, "http://")
	_, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ready", func(t *testing.T) {
		for _, tc := range []struct {
			env  []string
			args []string
		}{
			{nil, []string{"-addr", hostPort}},
			// The service's own environment names the server.
			{[]string{"GATEWAY_ADDR=" + hostPort}, nil},
			// Listening on every interface: probed on loopback.
			{nil, []string{"-addr", "0.0.0.0:" + port}},
			{nil, []string{"-addr", ":" + port}},
			{nil, []string{"-url", srv.base}},
			{nil, []string{"-url", srv.base + "/readyz"}},
		} {
			code, out, errOut := runCLI(t, tc.env, append([]string{"health"}, tc.args...)...)
			if code != 0 || !strings.Contains(out, "ready") || errOut != "" {
				t.Errorf("%v gateway health %v: exit %d, stdout %q, stderr %q; want 0 and ready", tc.env, tc.args, code, out, errOut)
			}
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"-addr", hostPort, "-url", srv.base},
			{"-addr", "127.0.0.1:0"},
			{"-addr", "nonsense"},
			{"-url", "127.0.0.1:8080"},
			{"-timeout", "soon"},
			{"-timeout", "0s"},
			{"extra"},
		} {
			code, _, errOut := runCLI(t, nil, append([]string{"health"}, args...)...)
			if code != 2 || errOut == "" {
				t.Errorf("gateway health %v: exit %d, stderr %q; want 2 with a message", args, code, errOut)
			}
		}
	})

	t.Run("stuck", func(t *testing.T) {
		// A stopped process keeps its socket: the kernel accepts the
		// connection, and nothing answers.
		srv.Freeze()
		code, _, errOut := runCLI(t, nil, "health", "-addr", hostPort, "-timeout", "300ms")
		srv.Thaw()
		if code != 1 || !strings.Contains(errOut, "no answer from http://"+hostPort+"/readyz within 300ms") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("gateway health on a frozen server: exit %d, stderr %q; want 1 and one line saying no answer within 300ms", code, errOut)
		}
	})

	// A tab that never answers the close handshake holds the drain of a
	// stop open for its 5 s: /readyz answers 503 meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+hostPort+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Run("draining", func(t *testing.T) {
		deadline := time.Now().Add(4 * time.Second) // within the drain's 5 s
		for {
			code, _, errOut := runCLI(t, nil, "health", "-addr", hostPort)
			if code == 0 && time.Now().Before(deadline) {
				continue // the signal is not handled yet
			}
			want := `not ready: http://` + hostPort + `/readyz answered 503 with status "stopping"`
			if code != 1 || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("gateway health while the server drains: exit %d, stderr %q; want 1 and one line saying %s", code, errOut, want)
			}
			return
		}
	})
	if code := srv.WaitExit(20 * time.Second); code != 0 {
		t.Fatalf("the server exited %d after SIGTERM, want 0", code)
	}

	t.Run("stopped", func(t *testing.T) {
		code, out, errOut := runCLI(t, nil, "health", "-addr", hostPort)
		want := "nothing answers at http://" + hostPort + "/readyz (connection refused): is the gateway running?"
		if code != 1 || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("gateway health after the server stopped: exit %d, stdout %q, stderr %q; want 1 and one line saying %q", code, out, errOut, want)
		}
	})
}

func TestHealthProbesLoopbackForAnyAddress(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8080":   "http://127.0.0.1:8080/readyz",
		"0.0.0.0:8080":     "http://127.0.0.1:8080/readyz",
		":8080":            "http://127.0.0.1:8080/readyz",
		"[::]:8080":        "http://[::1]:8080/readyz",
		"[::1]:9000":       "http://[::1]:9000/readyz",
		"chat.internal:80": "http://chat.internal:80/readyz",
	} {
		if got, err := readyzOfAddr(addr); got != want || err != nil {
			t.Errorf("readyzOfAddr(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	for base, want := range map[string]string{
		"https://chat.example.com":          "https://chat.example.com/readyz",
		"https://chat.example.com/":         "https://chat.example.com/readyz",
		"https://example.com/chat/?x=1":     "https://example.com/chat/readyz",
		"http://127.0.0.1:8080/readyz":      "http://127.0.0.1:8080/readyz",
		"https://u:pw@chat.example.com/sub": "https://u:pw@chat.example.com/sub/readyz",
	} {
		if got, err := readyzOfURL(base); got != want || err != nil {
			t.Errorf("readyzOfURL(%q) = %q, %v; want %q", base, got, err, want)
		}
	}
}
