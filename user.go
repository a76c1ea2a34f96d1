package main

// gateway user: accounts for -auth password and -auth header.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/honestcancel/gateway/auth"
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

func userCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	sub, args, fs, db, code := subcommand("user", userUsage, args, stdout, stderr)
	if code >= 0 {
		return code
	}
	revokeTokens := new(bool)
	if sub == "passwd" {
		fs.BoolVar(revokeTokens, "revoke-tokens", false, "also revoke every API token of the account")
	}
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	fail := failure(stderr, "gateway user "+sub)
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
	// onAccount runs do on the account the command names, in the database
	// (which must exist).
	onAccount := func(do func(acc store.Accounts, name string) error) int {
		name, ok := wantName()
		if !ok {
			return 2
		}
		return withAccounts(ctx, *db, false, fail, func(acc store.Accounts) error { return do(acc, name) })
	}
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
		return withAccounts(ctx, *db, sub == "add", fail, func(acc store.Accounts) error {
			if sub == "add" {
				u, err := acc.CreateUser(ctx, name, hash)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "created user %s (%s); serve with -auth password so they can sign in\n", u.Name, u.UserID)
				return nil
			}
			revoked, err := acc.ResetPassword(ctx, name, hash, *revokeTokens)
			if err != nil {
				return err
			}
			if *revokeTokens {
				fmt.Fprintf(stdout, "changed the password of %s, signed out all their sessions and revoked their API tokens (%d)\n", name, revoked)
				return nil
			}
			fmt.Fprintf(stdout, "changed the password of %s and signed out all their sessions\n", name)
			return nil
		})
	case "sessions":
		return onAccount(func(acc store.Accounts, name string) error {
			sessions, err := acc.Sessions(ctx, name, time.Now())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CREATED\tEXPIRES")
			for _, s := range sessions {
				fmt.Fprintf(tw, "%s\t%s\n", s.CreatedAt.Format(time.DateTime), s.ExpiresAt.Format(time.DateTime))
			}
			tw.Flush()
			fmt.Fprintf(stderr, "%d sessions of %s; end them with: gateway user signout %s\n", len(sessions), name, name)
			return nil
		})
	case "signout":
		return onAccount(func(acc store.Accounts, name string) error {
			n, err := acc.EndSessions(ctx, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "ended %d sessions of %s: every browser signed in as %s must sign in again (API tokens stay: gateway token list -user %s)\n", n, name, name, name)
			return nil
		})
	case "del":
		return onAccount(func(acc store.Accounts, name string) error {
			if err := acc.DeleteUser(ctx, name); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "deleted user %s: their sessions and tokens ended; their conversations stay in the database, unreachable\n", name)
			return nil
		})
	case "list":
		return withAccounts(ctx, *db, false, fail, func(acc store.Accounts) error {
			users, err := acc.Users(ctx)
			if err != nil {
				return err
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
			return nil
		})
	default:
		fmt.Fprintf(stderr, "gateway user: unknown command %q\n\n%s\n", sub, userUsage)
		return 2
	}
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
