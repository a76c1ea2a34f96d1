package main

// What the subcommands share: the sub-command and -db of a command group,
// opening the database, and how errors and values are printed.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// subcommand reads the sub-command of group (user, token) and makes its
// flag set, with -db. Without one it prints usage to stderr and code is 2;
// for -h or help it prints usage to stdout and code is 0; otherwise code
// is -1 and the caller goes on.
func subcommand(group, usage string, args []string, stdout, stderr io.Writer) (sub string, rest []string, fs *flag.FlagSet, db *string, code int) {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return "", nil, nil, nil, 2
	}
	if args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(stdout, usage)
		return "", nil, nil, nil, 0
	}
	sub = args[0]
	fs, db = dbFlagSet(group+" "+sub, "SQLite database file (GATEWAY_DB)", stderr)
	return sub, args[1:], fs, db, -1
}

// dbFlagSet makes the flag set of the command name, which reports to
// stderr, with its -db flag (GATEWAY_DB or data/gateway.db), described by
// usage.
func dbFlagSet(name, usage string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", env("GATEWAY_DB", "data/gateway.db"), usage)
	hideSecretDefaults(fs, "db") // (a PostgreSQL URL's password)
	return fs, db
}

// failure returns how a subcommand reports a failed step: the error's
// user-facing text after what (gateway user add), and exit code 1.
func failure(stderr io.Writer, what string) func(error) int {
	return func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", what, plain(err))
		return 1
	}
}

// openAccounts opens the database for an account command; only user add may
// create it.
func openAccounts(ctx context.Context, db string, create bool) (*store.Store, error) {
	if missingDB(db) && !create {
		return nil, fmt.Errorf("no database at %s: pass -db PATH (or create a user first with gateway user add)", db)
	}
	return store.Open(ctx, db, store.Options{})
}

// withAccounts runs do on the accounts of the database db (opened as
// openAccounts does, closed after) and returns the command's exit code:
// 0, or fail's for an error opening the database or of do.
func withAccounts(ctx context.Context, db string, create bool, fail func(error) int, do func(acc store.Accounts) error) int {
	st, err := openAccounts(ctx, db, create)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if err := do(st.Accounts()); err != nil {
		return fail(err)
	}
	return 0
}

// openExisting opens the database db of the command what (gateway check),
// which must exist. Without one it says so on stderr and code is 2; when
// opening fails it says why and code is failed; otherwise code is -1 and
// the caller goes on (and closes st).
func openExisting(ctx context.Context, what, db string, stderr io.Writer, failed int) (st *store.Store, code int) {
	if missingDB(db) {
		fmt.Fprintf(stderr, "%s: no database at %s: pass -db PATH\n", what, db)
		return nil, 2
	}
	st, err := store.Open(ctx, db, store.Options{})
	if err != nil {
		fmt.Fprintln(stderr, what+":", err)
		return nil, failed
	}
	return st, -1
}

// missingDB reports whether -db names a SQLite file that does not exist
// (a PostgreSQL URL is checked by connecting).
func missingDB(db string) bool {
	if store.IsPostgres(db) {
		return false
	}
	_, err := os.Stat(db)
	return err != nil
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
