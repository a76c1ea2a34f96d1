package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// The account commands work on the database directly, also while the
// server runs: sessions and tokens are looked up on every request, so a
// revoked token or a changed password takes effect at once (an open
// WebSocket ends at its first command after the server's 1 s credential
// cache, auth.DefaultCredentialCache, and within one ping interval).

const userUsage = `Usage:
  gateway user add NAME [-db PATH]      create an account; the password is read from the terminal or one line of stdin
  gateway user passwd [--revoke-tokens] NAME [-db PATH]
                                        set a new password and sign out every session of the account;
                                        --revoke-tokens also revokes its API tokens
  gateway user sessions NAME [-db PATH] list the account's sessions (when each began and ends)
  gateway user signout NAME [-db PATH]  end every session of the account at once (its API tokens stay)
  gateway user del NAME [-db PATH]      delete an account: its sessions and tokens end at once
  gateway user list [-db PATH]`

const tokenUsage = `Usage:
  gateway token create -user NAME [-name LABEL] [-ttl 720h] [-db PATH]
                                        create an API token for programs (Authorization: Bearer); it is shown once
  gateway token revoke TOKEN_ID [-db PATH]
  gateway token list [-user NAME] [-db PATH]`

func userCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, userUsage)
		return 2
	}
	if args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(stdout, userUsage)
		return 0
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("user "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", env("GATEWAY_DB", "data/gateway.db"), "SQLite database file (GATEWAY_DB)")
	revokeTokens := new(bool)
	if sub == "passwd" {
		fs.BoolVar(revokeTokens, "revoke-tokens", false, "also revoke every API token of the account")
	}
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gateway user %s: %v\n", sub, plain(err))
		return 1
	}
	wantName := func() (string, bool) {
		if len(rest) != 1 {
			fmt.Fprintf(stderr, "gateway user %s: name one user: gateway user %s NAME\n", sub, sub)
			return "", false
		}
		name, err := auth.NormalizeName(rest[0])
		if err != nil {
			fmt.Fprintf(stderr, "gateway user %s: %v\n", sub, err)
			return "", false
		}
		return name, true
	}
	ctx := context.Background()
	switch sub {
	case "add", "passwd":
		name, ok := wantName()
		if !ok {
			return 2
		}
		password, err := readPassword(stdin, stderr, name)
		if err != nil {
			return fail(err)
		}
		hash, err := auth.HashPassword(password, 0)
		if err != nil {
			return fail(err)
		}
		st, err := openAccounts(ctx, *db, sub == "add")
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		if sub == "add" {
			u, err := st.Accounts().CreateUser(ctx, name, hash)
			if err != nil {
				return fail(err)
			}
			fmt.Fprintf(stdout, "created user %s (%s); serve with -auth password so they can sign in\n", u.Name, u.UserID)
			return 0
		}
		revoked, err := st.Accounts().ResetPassword(ctx, name, hash, *revokeTokens)
		if err != nil {
			return fail(err)
		}
		if *revokeTokens {
			fmt.Fprintf(stdout, "changed the password of %s, signed out all their sessions and revoked their API tokens (%d)\n", name, revoked)
			return 0
		}
		fmt.Fprintf(stdout, "changed the password of %s and signed out all their sessions\n", name)
	case "sessions":
		name, ok := wantName()
		if !ok {
			return 2
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		sessions, err := st.Accounts().Sessions(ctx, name, time.Now())
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CREATED\tEXPIRES")
		for _, s := range sessions {
			fmt.Fprintf(tw, "%s\t%s\n", s.CreatedAt.Format(time.DateTime), s.ExpiresAt.Format(time.DateTime))
		}
		tw.Flush()
		fmt.Fprintf(stderr, "%d sessions of %s; end them with: gateway user signout %s\n", len(sessions), name, name)
	case "signout":
		name, ok := wantName()
		if !ok {
			return 2
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		n, err := st.Accounts().EndSessions(ctx, name)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "ended %d sessions of %s: every browser signed in as %s must sign in again (API tokens stay: gateway token list -user %s)\n", n, name, name, name)
	case "del":
		name, ok := wantName()
		if !ok {
			return 2
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		if err := st.Accounts().DeleteUser(ctx, name); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "deleted user %s: their sessions and tokens ended; their conversations stay in the database, unreachable\n", name)
	case "list":
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		users, err := st.Accounts().Users(ctx)
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tID\tPASSWORD\tCREATED")
		for _, u := range users {
			created := u.CreatedAt.Format(time.DateTime)
			if u.CreatedAt.UnixMilli() == 0 {
				created = "-" // the built-in local user of -auth none
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.Name, u.UserID, yesNo(u.HasPassword), created)
		}
		tw.Flush()
	default:
		fmt.Fprintf(stderr, "gateway user: unknown command %q\n\n%s\n", sub, userUsage)
		return 2
	}
	return 0
}

func tokenCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, tokenUsage)
		return 2
	}
	if args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(stdout, tokenUsage)
		return 0
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("token "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", env("GATEWAY_DB", "data/gateway.db"), "SQLite database file (GATEWAY_DB)")
	user := fs.String("user", "", "the account the token acts as")
	label := fs.String("name", "", "what the token is for (shown by list)")
	ttl := fs.Duration("ttl", 0, "how long the token is valid; 0 until revoked")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gateway token %s: %v\n", sub, plain(err))
		return 1
	}
	ctx := context.Background()
	switch sub {
	case "create":
		name, err := auth.NormalizeName(*user)
		if err != nil || len(rest) > 0 || *ttl < 0 {
			fmt.Fprintln(stderr, "gateway token create: name the account with -user NAME (and a -ttl of 0 or more)")
			return 2
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		tok, secret, err := auth.CreateToken(ctx, st.Accounts(), name, *label, *ttl, time.Now())
		if err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, secret)
		until := "until revoked"
		if tok.ExpiresAt != nil {
			until = "until " + tok.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(stderr, "token %s for %s, valid %s. It is shown only now: send it as \"Authorization: Bearer <token>\"; revoke it with: gateway token revoke %s\n", tok.TokenID, name, until, tok.TokenID)
	case "revoke":
		if len(rest) != 1 {
			fmt.Fprintln(stderr, "gateway token revoke: name one token id: gateway token revoke TOKEN_ID (see gateway token list)")
			return 2
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		id, _, _ := strings.Cut(rest[0], ".") // a whole token names its id too
		if err := st.Accounts().RevokeToken(ctx, id); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "revoked token %s\n", id)
	case "list":
		name := ""
		if *user != "" {
			if name, err = auth.NormalizeName(*user); err != nil {
				return fail(err)
			}
		}
		st, err := openAccounts(ctx, *db, false)
		if err != nil {
			return fail(err)
		}
		defer st.Close()
		toks, err := st.Accounts().Tokens(ctx, name)
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tUSER\tNAME\tCREATED\tEXPIRES\tREVOKED")
		for _, t := range toks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.TokenID, t.UserName, t.Name, t.CreatedAt.Format(time.DateTime), when(t.ExpiresAt), when(t.RevokedAt))
		}
		tw.Flush()
	default:
		fmt.Fprintf(stderr, "gateway token: unknown command %q\n\n%s\n", sub, tokenUsage)
		return 2
	}
	return 0
}

// openAccounts opens the database for an account command; only user add may
// create it.
func openAccounts(ctx context.Context, db string, create bool) (*store.Store, error) {
	if missingDB(db) && !create {
		return nil, fmt.Errorf("no database at %s: pass -db PATH (or create a user first with gateway user add)", db)
	}
	return store.Open(ctx, db, store.Options{})
}

// readPassword asks twice on a terminal; from a pipe it takes one line.
func readPassword(stdin io.Reader, stderr io.Writer, name string) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintf(stderr, "Password for %s: ", name)
		first, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
		if err := auth.CheckPassword(string(first)); err != nil {
			return "", err
		}
		fmt.Fprint(stderr, "Again: ")
		again, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
		if string(first) != string(again) {
			return "", errors.New("the passwords differ: nothing changed, try again")
		}
		return string(first), nil
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("no password on stdin: type it on a terminal, or pipe one line (printf '%s\\n' \"$PASSWORD\" | gateway user add NAME)")
	}
	return line, nil
}

// parseInterspersed parses flags before and after the positional
// arguments ("user add alice -db x" as well as "user add -db x alice").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// plain is an error's user-facing message: a protocol error's own text.
func plain(err error) string {
	var e *chat.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.DateTime)
}
