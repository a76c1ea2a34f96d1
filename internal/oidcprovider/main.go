// Command oidcprovider runs an OpenID Connect provider on 127.0.0.1 for the
// browser test of signing in through one (e2e/oidc.test.mjs): mockoidc
// through package oidctest, for the client given by -client-id and the
// secret in the environment variable OIDC_CLIENT_SECRET. It prints
// "issuer URL" once it serves; its authorization endpoint signs in as the
// user last posted as JSON to /control/next-user (oidctest.User), or
// mockoidc's default user. It stops when its standard input closes.
//
//	go run ./internal/oidcprovider -client-id gateway
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/honestcancel/gateway/internal/oidctest"
)

func main() {
	clientID := flag.String("client-id", "gateway", "the client's id")
	flag.Parse()
	secret := os.Getenv("OIDC_CLIENT_SECRET")
	if secret == "" {
		fmt.Fprintln(os.Stderr, "oidcprovider: set OIDC_CLIENT_SECRET to the client's secret")
		os.Exit(2)
	}
	p, err := oidctest.Start(*clientID, secret, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oidcprovider:", err)
		os.Exit(1)
	}
	fmt.Println("issuer", p.Issuer())
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := p.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "oidcprovider:", err)
		os.Exit(1)
	}
}
