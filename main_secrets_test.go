package main

// -db and -nats from files (-db-file, -nats-file and their _FILE
// variables) against the real binary, and their passwords kept out of
// logs, errors and -h.

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/internal/natstest"
	"github.com/honestcancel/gateway/internal/pgtest"
)

// writeSecret writes content (and the newline an editor leaves) to a new
// file of the test's and returns its path.
func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// withPassword is the URL raw with the password pw in its user info.
func withPassword(t *testing.T, raw, user, pw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.User != nil && user == "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, pw)
	return u.String()
}

// TestSQLiteDatabaseFromFile: GATEWAY_DB_FILE names the database as -db
// would (a path here; a URL below).
func TestSQLiteDatabaseFromFile(t *testing.T) {
	db := filepath.Join(t.TempDir(), "from-file.db")
	srv := startServerEnv(t, []string{"GATEWAY_DB_FILE=" + writeSecret(t, "db", db)}, "", "5ms")
	srv.CreateThread()
	if !exists(db) || !strings.Contains(srv.Stderr(), "db="+db) {
		t.Errorf("the server did not use the database named in GATEWAY_DB_FILE (%s); log:\n%s", db, srv.Stderr())
	}
}

// TestPostgresAndNATSURLsFromFiles: the URLs of several instances, with
// passwords, from -db-file and -nats-file; the passwords (which
// PostgreSQL's trust authentication and a NATS server without
// authorization ignore) never appear in the log.
func TestPostgresAndNATSURLsFromFiles(t *testing.T) {
	const pw = "dummy-Pa55word"
	dsn := withPassword(t, pgtest.Schema(t), "", pw)
	nats := withPassword(t, natstest.Start(t).URL(), "gw", pw)
	srv := startProcess(t, "", "5ms", "-db-file", writeSecret(t, "db-url", dsn), "-nats-file", writeSecret(t, "nats-url", nats))
	srv.CreateThread()
	srv.Stop()
	logs := srv.Stderr()
	if strings.Contains(logs, pw) {
		t.Errorf("the log holds the password:\n%s", logs)
	}
	if want := app.RedactedURL(dsn); !strings.Contains(logs, want) || !strings.Contains(want, ":xxxxx@") {
		t.Errorf("the log does not name the database as %s; log:\n%s", want, logs)
	}
}

func TestSecretURLsRefused(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "never.db")
	const pgWithSecret = "postgres://u:secret@127.0.0.1:5432/db"
	dbFile := writeSecret(t, "db-url", pgWithSecret)
	natsFile := writeSecret(t, "nats-url", "nats://u:secret@127.0.0.1:4222")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	settings := writeSecret(t, "gateway.conf", "db = "+db)

	// Each exits 2 saying what, never the password "secret", creating nothing.
	wantStartsRefused(t, db, []refusedStart{
		{[]string{"-db-file", dbFile}, "the database (-db) is set twice: by -db (GATEWAY_DB"},
		// (-db "": not given.)
		{[]string{"-db", "", "-db-file", filepath.Join(dir, "missing")}, "-db-file: cannot read"},
		{[]string{"-db", "", "-db-file", empty}, "-db-file: " + empty + " is empty"},
		{[]string{"-db", pgWithSecret, "-nats", "nats://u:secret@127.0.0.1:4222", "-nats-file", natsFile}, "-nats-file (GATEWAY_NATS_FILE)"},
		// It was read: the error shows it, redacted.
		{[]string{"-nats-file", natsFile}, "-nats nats://u:xxxxx@127.0.0.1:4222 needs a PostgreSQL -db"},
		{[]string{"-nats", "nats://u:secret@a:4222,nats://v:secret@b:4222"}, "-nats nats://u:xxxxx@a:4222,nats://v:xxxxx@b:4222 needs"},
		{[]string{"-db", "postgres://u:secret%zz@127.0.0.1:5432/db"}, "-db does not parse as a URL (it is not shown"},
		{[]string{"-db", pgWithSecret, "-nats", "nats://u:secret%zz@127.0.0.1:4222"}, "-nats does not parse as a URL"},
	})

	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"GATEWAY_DB=" + pgWithSecret}, []string{"-db-file", dbFile}, "-db-file (GATEWAY_DB_FILE)"},
		{[]string{"GATEWAY_DB_FILE=" + dbFile}, []string{"-config", settings}, `"db" in the settings file`},
		{[]string{"GATEWAY_NATS=nats://u:secret@127.0.0.1:4222", "GATEWAY_NATS_FILE=" + natsFile}, []string{"-db", pgWithSecret}, "the NATS URL (-nats) is set twice"},
	} {
		args := append([]string{"-addr", "127.0.0.1:0"}, tc.args...)
		code, _, errOut := runCLI(t, tc.env, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "secret") {
			t.Errorf("%v gateway %v: exit %d, stderr %q; want exit 2 saying %q (and never the password)", tc.env, args, code, errOut, tc.want)
		}
	}
	if exists(db) {
		t.Errorf("a refused configuration created %s", db)
	}

	// A database that cannot be reached: the error names it, redacted.
	code, _, errOut := runCLI(t, nil, "-addr", "127.0.0.1:0", "-db-file", writeSecret(t, "unreachable", "postgres://u:secret@127.0.0.1:1/db?sslmode=disable"))
	if code != 1 || !strings.Contains(errOut, "postgres://u:xxxxx@127.0.0.1:1/db") || strings.Contains(errOut, "secret") {
		t.Errorf("gateway -db-file (unreachable PostgreSQL): exit %d, stderr %q; want 1 naming the database, never the password", code, errOut)
	}
}

// TestHelpHidesSecretDefaults: -h prints the defaults its variables give,
// the URLs' passwords redacted.
func TestHelpHidesSecretDefaults(t *testing.T) {
	const pw = "hunter2-pw"
	env := []string{"GATEWAY_DB=postgres://u:" + pw + "@db.internal:5432/gw", "GATEWAY_NATS=nats://a:" + pw + "@n1:4222,nats://b:" + pw + "@n2:4222"}
	for _, args := range [][]string{{"-h"}, {"serve", "-h"}, {"check", "-h"}, {"backup", "-h"}, {"user", "list", "-h"}, {"token", "list", "-h"}} {
		code, out, errOut := runCLI(t, env, args...)
		help := out + errOut
		wants := []string{`(default "postgres://u:xxxxx@db.internal:5432/gw")`}
		if len(args) == 1 || args[0] == "serve" {
			wants = append(wants, `(default "nats://a:xxxxx@n1:4222,nats://b:xxxxx@n2:4222")`, "-db-file", "-nats-file")
		}
		for _, want := range wants {
			if !strings.Contains(help, want) {
				t.Errorf("gateway %v: the help does not say %s", args, want)
			}
		}
		// (The subcommands exit 2 after their help, as after any usage error.)
		if (code != 0 && len(wants) > 1) || strings.Contains(help, pw) {
			t.Errorf("gateway %v: exit %d, help:\n%s\nwant 0 and no password", args, code, help)
		}
	}
}
