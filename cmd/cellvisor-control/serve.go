package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/controlapi"
	"cellvisor/systemd"
)

// defaultData is serve's --data and the home of the admin token file the
// other commands read by default.
const defaultData = "/var/lib/cellvisor-control"

// listFlag is a repeatable string flag: each use appends.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	*l = append(*l, s)
	return nil
}

func newLogger(format, level string) (*zap.Logger, error) {
	var zc zap.Config
	switch format {
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		zc.DisableStacktrace = true
	case "json":
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	default:
		return nil, fmt.Errorf("log format %q: want json or console", format)
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	return zc.Build()
}

func cmdServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c controlapi.Config
	fs.StringVar(&c.Data, "data", defaultData, "data directory: the SQLite database, the key file and the admin token")
	fs.StringVar(&c.DB, "db", "", "postgres:// URL of the store; empty for <data>/control.db (SQLite)")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8443", "the edge-control API's address (TLS)")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8442", "the admin API's address (plain HTTP: loopback only, unless --admin-tls)")
	fs.BoolVar(&c.AdminTLS, "admin-tls", false, "serve the admin API over TLS with the server certificate")
	fs.Var((*listFlag)(&c.Hostnames), "hostname", "a DNS name or IP for the server certificate (repeatable; default localhost and loopback)")
	fs.StringVar(&c.KeyFile, "key-file", "", "the key that seals keys at rest; empty for <data>/seal.key")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", "", "the admin token, created when absent; empty for <data>/admin.token")
	format := fs.String("log-format", "json", "log encoding: json or console")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("serve: unexpected argument %q", pos[0])
	}
	log, err := newLogger(*format, *level)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
	c.Logger = log
	tokenFile := c.AdminTokenFile
	if tokenFile == "" {
		tokenFile = filepath.Join(c.Data, "admin.token")
	}
	n := systemd.New(log)
	stopping := context.AfterFunc(ctx, n.Stopping)
	defer stopping()
	err = controlapi.Serve(ctx, c, func(ep controlapi.Endpoints) {
		log.Info("ready", zap.String("edge_api", ep.EdgeURL), zap.String("admin_api", ep.AdminURL),
			zap.String("admin_token_file", tokenFile), zap.String("signing_public_key", ep.PublicKey))
		n.Ready()
	})
	if err != nil {
		log.Error("control API stopped with errors", zap.Error(err))
		return err
	}
	log.Info("stopped")
	return nil
}
