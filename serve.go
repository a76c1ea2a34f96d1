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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// -outbox-fault crash: the process dies right after the provider
	// accepted, as a gateway killed before it heard the answer.
	return serveWith(ctx, args, stderr, func() { os.Exit(3) })
}

// serveWith is the serve subcommand until ctx ends, logging to logs; crash
// is what -outbox-fault crash does once the provider accepted (nil: the
// send fails as if the answer were lost). It returns the exit code: 0
// after a clean shutdown, 1 when serving failed, 2 for bad flags. The
// tests run it in their own process for what needs no process boundary.
func serveWith(ctx context.Context, args []string, logs io.Writer, crash func()) int {
	cfg, err := parseServe(args, logs)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(logs, "gateway:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintln(logs, "gateway: -log-level:", err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler = slog.NewTextHandler(logs, opts)
	if cfg.logFormat == "json" {
		handler = slog.NewJSONHandler(logs, opts)
	}
	log := slog.New(handler)
	cfg.OutboxCrash = crash
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
	a, err := app.New(ctx, cfg.Config, log)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}
