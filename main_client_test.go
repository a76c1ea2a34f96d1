// What the root tests send and read besides the protocol helpers of
// apptest.Server (which every root server embeds): raw HTTP, the CLI
// subcommands, and the database check at the end.

package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The CLI.

// runCLI runs the binary to completion (bounded) and returns its exit code
// and output.
func runCLI(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIWith(t, env, "", args...)
}

// runCLIWith is runCLI with input on stdin (a password line for user
// add/passwd).
func runCLIWith(t *testing.T, env []string, input string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), args...)
	cmd.Env = childEnv(env...)
	cmd.Stdin = strings.NewReader(input)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gateway %s did not exit within 30s (stdout %q, stderr %q)", strings.Join(args, " "), out.String(), errb.String())
	}
	noRace(t, "gateway "+strings.Join(args, " "), errb.String())
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("gateway %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// checkDB runs `gateway check -db path` and requires exit 0 and "ok".
func checkDB(t *testing.T, db string) {
	t.Helper()
	code, out, errOut := runCLI(t, nil, "check", "-db", db)
	if code != 0 || !strings.HasPrefix(out, "ok") {
		t.Fatalf("gateway check -db %s: exit %d, want 0 and \"ok\"\nstdout:\n%s\nstderr:\n%s", db, code, out, errOut)
	}
}

// refusedStart is a serve configuration (its flags come after -addr
// 127.0.0.1:0 -db DB) that must not start, and what the refusal says.
type refusedStart struct {
	args []string
	want string
}

// wantStartsRefused requires that each configuration exits 2 saying its
// want (and never the password "secret" of a URL it was given), and that
// none of them created the database db.
func wantStartsRefused(t *testing.T, db string, starts []refusedStart) {
	t.Helper()
	for _, tc := range starts {
		args := append([]string{"-addr", "127.0.0.1:0", "-db", db}, tc.args...)
		code, _, errOut := runCLI(t, nil, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "secret") {
			t.Errorf("gateway %s: exit %d, stderr %q; want exit 2 saying %q (and never the password)", strings.Join(args, " "), code, errOut, tc.want)
		}
	}
	if exists(db) {
		t.Errorf("a refused configuration still created the database %s", db)
	}
}
