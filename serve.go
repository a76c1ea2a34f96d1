package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/honestcancel/gateway/app"
)

func serve(args []string, stderr io.Writer) int {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintln(stderr, "gateway: -log-level:", err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler = slog.NewTextHandler(stderr, opts)
	if cfg.logFormat == "json" {
		handler = slog.NewJSONHandler(stderr, opts)
	}
	log := slog.New(handler)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveUntilDone(ctx, cfg, log); err != nil {
		log.Error("gateway stopped", "err", err)
		return 1
	}
	return 0
}

// serveUntilDone builds the gateway from cfg, serves until ctx ends, and
// shuts down in order: stop accepting, end streams, hand runs back, close
// the store.
func serveUntilDone(ctx context.Context, cfg config, log *slog.Logger) error {
	c := cfg.Config
	// -outbox-fault crash: the process dies right after the provider
	// accepted, as a gateway killed before it heard the answer.
	c.OutboxCrash = func() { os.Exit(3) }
	a, err := app.New(ctx, c, log)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}
