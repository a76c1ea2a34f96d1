package main

// gateway token: API tokens for programs (Authorization: Bearer).

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/store"
)

const tokenUsage = `Usage:
  gateway token create -user NAME [-name LABEL] [-ttl 720h] [-db PATH]
                                        create an API token for programs (Authorization: Bearer); it is shown once
  gateway token revoke TOKEN_ID [-db PATH]
  gateway token list [-user NAME] [-db PATH]`

func tokenCmd(args []string, stdout, stderr io.Writer) int {
	sub, args, fs, db, code := subcommand("token", tokenUsage, args, stdout, stderr)
	if code >= 0 {
		return code
	}
	user := fs.String("user", "", "the account the token acts as")
	label := fs.String("name", "", "what the token is for (shown by list)")
	ttl := fs.Duration("ttl", 0, "how long the token is valid; 0 until revoked")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	fail := failure(stderr, "gateway token "+sub)
	ctx := context.Background()
	switch sub {
	case "create":
		name, err := auth.NormalizeName(*user)
		if err != nil || len(rest) > 0 || *ttl < 0 {
			fmt.Fprintln(stderr, "gateway token create: name the account with -user NAME (and a -ttl of 0 or more)")
			return 2
		}
		return withAccounts(ctx, *db, false, fail, func(acc store.Accounts) error {
			tok, secret, err := auth.CreateToken(ctx, acc, name, *label, *ttl, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, secret)
			until := "until revoked"
			if tok.ExpiresAt != nil {
				until = "until " + tok.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(stderr, "token %s for %s, valid %s. It is shown only now: send it as \"Authorization: Bearer <token>\"; revoke it with: gateway token revoke %s\n", tok.TokenID, name, until, tok.TokenID)
			return nil
		})
	case "revoke":
		if len(rest) != 1 {
			fmt.Fprintln(stderr, "gateway token revoke: name one token id: gateway token revoke TOKEN_ID (see gateway token list)")
			return 2
		}
		id, _, _ := strings.Cut(rest[0], ".") // a whole token names its id too
		return withAccounts(ctx, *db, false, fail, func(acc store.Accounts) error {
			if err := acc.RevokeToken(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "revoked token %s\n", id)
			return nil
		})
	case "list":
		name := ""
		if *user != "" {
			if name, err = auth.NormalizeName(*user); err != nil {
				return fail(err)
			}
		}
		return withAccounts(ctx, *db, false, fail, func(acc store.Accounts) error {
			toks, err := acc.Tokens(ctx, name)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSER\tNAME\tCREATED\tEXPIRES\tREVOKED")
			for _, t := range toks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.TokenID, t.UserName, t.Name, t.CreatedAt.Format(time.DateTime), when(t.ExpiresAt), when(t.RevokedAt))
			}
			tw.Flush()
			return nil
		})
	default:
		fmt.Fprintf(stderr, "gateway token: unknown command %q\n\n%s\n", sub, tokenUsage)
		return 2
	}
}
