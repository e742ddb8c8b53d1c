package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/agent"
	"cellvisor/config"
)

func versionString() string { return "cellvisor " + agent.Version }

func newLogger(c config.Log) (*zap.Logger, error) {
	var zc zap.Config
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		zc.DisableStacktrace = true
	} else {
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	lvl, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	return zc.Build()
}

func cmdRun(ctx context.Context, path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
	log.Info("starting", zap.String("version", agent.Version), zap.String("config", path))
	a, err := agent.New(cfg, log)
	if err != nil {
		log.Error("refusing to start", zap.Error(err))
		return fmt.Errorf("start agent: %w", err)
	}
	if err := a.Run(ctx); err != nil {
		log.Error("agent stopped with errors", zap.Error(err))
		return err
	}
	log.Info("agent stopped")
	return nil
}
