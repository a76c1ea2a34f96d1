package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/store"
)

// -sqlite-synchronous comes from the flag, the variable or the settings
// file like every setting, and is refused with a PostgreSQL -db.
func TestSQLiteSynchronousSetting(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	pg := "postgres://gw@127.0.0.1:5432/gw"
	for _, tc := range []struct {
		name    string
		env     string // GATEWAY_SQLITE_SYNCHRONOUS
		args    []string
		lines   []string // settings file
		want    string   // cfg.SQLiteSynchronous
		wantErr string
	}{
		{name: "default", want: store.DefaultSynchronous},
		{name: "flag", args: []string{"-sqlite-synchronous", "full"}, want: "full"},
		{name: "any case", args: []string{"-sqlite-synchronous", "NORMAL"}, want: "normal"},
		{name: "variable", env: "full", want: "full"},
		{name: "file", lines: []string{"sqlite-synchronous = full"}, want: "full"},
		{name: "flag beats variable", env: "full", args: []string{"-sqlite-synchronous", "normal"}, want: "normal"},
		{name: "bad flag", args: []string{"-sqlite-synchronous", "extra"}, wantErr: `-sqlite-synchronous (GATEWAY_SQLITE_SYNCHRONOUS) "extra": use full`},
		{name: "bad variable", env: "off", wantErr: `"off": use full`},
		{name: "empty flag", args: []string{"-sqlite-synchronous", ""}, wantErr: `"": use full`},
		{name: "postgres without it", args: []string{"-db", pg}, want: ""},
		{name: "postgres with the flag", args: []string{"-db", pg, "-sqlite-synchronous", "full"}, wantErr: "synchronous_commit"},
		{name: "postgres with the variable", env: "normal", args: []string{"-db", pg}, wantErr: "applies to a SQLite -db only"},
		{name: "postgres with the file", args: []string{"-db", pg}, lines: []string{"sqlite-synchronous = full"}, wantErr: "applies to a SQLite -db only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GATEWAY_SQLITE_SYNCHRONOUS", tc.env)
			args := append([]string{"-db", db}, tc.args...)
			if tc.lines != nil {
				args = append(args, "-config", writeConfig(t, tc.lines...))
			}
			cfg, err := parseServe(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.SQLiteSynchronous != tc.want {
				t.Fatalf("sqliteSync = %q, want %q", cfg.SQLiteSynchronous, tc.want)
			}
		})
	}
}

// The binary refuses a bad value before it creates anything, saying what
// to pass, and names the setting it serves with.
func TestSQLiteSynchronousBinary(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	code, _, stderr := runCLI(t, nil, "serve", "-db", db, "-addr", "127.0.0.1:0", "-sqlite-synchronous", "extra")
	if code != 2 || !strings.Contains(stderr, "use full") || !strings.Contains(stderr, "or normal") {
		t.Fatalf("exit %d, stderr %q; want 2 saying to use full or normal", code, stderr)
	}
	srv := startServerWith(t, db, "5ms", "-sqlite-synchronous", "full")
	if !strings.Contains(srv.Stderr(), "sqlite_synchronous=full") {
		t.Fatalf("the serving line does not name the setting:\n%s", srv.Stderr())
	}
}
