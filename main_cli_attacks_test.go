package main

// The command line as an attack surface: one table of invocations a
// careless operator or a hostile script might run against a live
// database, each refused with a message saying what to do, and each
// leaving the database, the accounts and the files around it exactly as
// they were.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// accountsFingerprint digests every account, session and token row (hashes,
// expiries, revocations, deletions) of the SQLite file at path, read-only.
func accountsFingerprint(t *testing.T, path string) string {
	t.Helper()
	db := auditDB(t, path)
	defer db.Close()
	h := sha256.New()
	for _, table := range []string{"users", "sessions", "api_tokens"} {
		rows, err := db.Query(`SELECT * FROM ` + table + ` ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(h, "%s %v\n", table, vals)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return hex.EncodeToString(h.Sum(nil))
}

// folderState lists dir's entries with their modes, sizes and, for small
// files, a digest of their contents.
func folderState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d", path, info.Mode(), info.Size())
		if info.Mode().IsRegular() && info.Size() < 1<<20 && !strings.HasPrefix(filepath.Base(path), "gw.db") {
			raw, _ := os.ReadFile(path)
			sum := sha256.Sum256(raw)
			fmt.Fprintf(&b, " %x", sum[:8])
		}
		b.WriteByte('\n')
		return nil
	})
	return b.String()
}

func TestCLIAttacksChangeNothing(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gw.db")
	addUser(t, db, "alice", "correct horse battery")
	token, _ := createToken(t, db, "alice")
	notes := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notes, []byte("not a database, and nobody's to overwrite\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nowhere", "gw.db")
	const secret = "sk-cli-attack-0123456789"

	cases := []struct {
		name  string
		stdin string
		args  []string
		code  int
		says  string // in stderr: what went wrong and what to do
	}{
		{"a password on the command line (shell history, process list)", "", []string{"user", "add", "mallory", "hunter2hunter2", "-db", db}, 2, "gateway user add NAME"},
		{"taking over an existing name", "a password of mine\n", []string{"user", "add", "alice", "-db", db}, 1, "already exists"},
		{"the same name in capitals", "a password of mine\n", []string{"user", "add", "ALICE", "-db", db}, 1, "already exists"},
		{"a name with a newline (forged log lines)", "a password of mine\n", []string{"user", "add", "eve\nsign-in succeeded user=alice", "-db", db}, 2, "may hold only"},
		{"a name with a path", "a password of mine\n", []string{"user", "add", "../../etc", "-db", db}, 2, "may hold only"},
		{"a password too short", "short\n", []string{"user", "passwd", "alice", "-db", db}, 1, "at least 8"},
		{"a password for nobody", "a password of mine\n", []string{"user", "passwd", "nobody", "-db", db}, 1, "gateway user list"},
		{"deleting nobody", "", []string{"user", "del", "nobody", "-db", db}, 1, "gateway user list"},
		{"signing out nobody", "", []string{"user", "signout", "nobody", "-db", db}, 1, "gateway user list"},
		{"a token for nobody", "", []string{"token", "create", "-user", "nobody", "-db", db}, 1, `no user "nobody"`},
		{"a token that never expires backwards", "", []string{"token", "create", "-user", "alice", "-ttl", "-1h", "-db", db}, 2, "-ttl of 0 or more"},
		{"revoking a token that is not there", "", []string{"token", "revoke", "tok_unknown", "-db", db}, 1, "gateway token list"},
		{"a backup over the live database", "", []string{"backup", "-db", db, db}, 1, "pick a new file name"},
		{"a backup over another file", "", []string{"backup", "-db", db, notes}, 1, "pick a new file name"},
		{"check on a file that is not a database", "", []string{"check", "-db", notes}, 2, "not a database"},
		{"an account in a file that is not a database", "a password of mine\n", []string{"user", "add", "bob", "-db", notes}, 1, "not a database"},
		{"a token in a database that does not exist", "", []string{"token", "create", "-user", "alice", "-db", missing}, 1, "pass -db PATH"},
		{"serving everyone on every interface without accounts", "", []string{"-addr", "0.0.0.0:0", "-db", db}, 2, "-auth password"},
		{"serving on every interface for any Host name", "", []string{"-addr", "0.0.0.0:0", "-auth", "password", "-db", db}, 2, "-allowed-hosts"},
		{"header mode without a trusted proxy", "", []string{"-addr", "127.0.0.1:0", "-auth", "header", "-db", db}, 2, "-trusted-proxies"},
		{"profiles on every interface", "", []string{"-addr", "127.0.0.1:0", "-admin-addr", "0.0.0.0:0", "-db", db}, 2, "not a loopback"},
		{"a model credential as a flag", "", []string{"-addr", "127.0.0.1:0", "-openai-header", "Authorization: Bearer " + secret, "-db", db}, 2, "GATEWAY_OPENAI_HEADERS"},
		{"connections that never end", "", []string{"-addr", "127.0.0.1:0", "-max-conn-age", "1ms", "-db", db}, 2, "-max-conn-age must be at least 1s"},
	}
	rows, accounts, files := dbFingerprint(t, db), accountsFingerprint(t, db), folderState(t, dir)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLIWith(t, nil, c.stdin, c.args...)
			if code != c.code || !strings.Contains(errOut, c.says) {
				t.Errorf("exit %d, stderr %q; want exit %d saying %q", code, errOut, c.code, c.says)
			}
			if strings.Contains(out+errOut, secret) || strings.Contains(out+errOut, token) {
				t.Errorf("a secret was echoed: stdout %q, stderr %q", out, errOut)
			}
			if got := dbFingerprint(t, db); got != rows {
				t.Errorf("the database changed:\n%s\n%s", rows, got)
			}
			if got := accountsFingerprint(t, db); got != accounts {
				t.Error("an account, session or token changed")
			}
			if got := folderState(t, dir); got != files {
				t.Errorf("the folder changed:\n%s\n%s", files, got)
			}
		})
	}
	// The account still signs in as before: nothing above touched it.
	srv := startServerWith(t, db, "5ms", "-auth", "password")
	srv.as(who{bearer: token}).Threads()
}
