package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"cellvisor/controlapi"
	"cellvisor/edgeapi"
	"cellvisor/internal/cli"
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

func (l *listFlag) Type() string { return "string" }

// admissionFlag is --edge-admission: class=N pairs, added to on each use.
type admissionFlag controlapi.Admission

func (a *admissionFlag) String() string { return controlapi.Admission(*a).String() }

func (a *admissionFlag) Set(s string) error {
	parsed, err := controlapi.ParseAdmission(s)
	if err != nil {
		return err
	}
	if *a == nil {
		*a = admissionFlag{}
	}
	for k, n := range parsed {
		(*a)[k] = n
	}
	return nil
}

func (a *admissionFlag) Type() string { return "class=N,..." }

func serveCmd() *cobra.Command {
	var c controlapi.Config
	var format, level string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run the control API: the edge-control API (TLS) on --listen, the admin API on --admin-listen",
		Long: `Run the control API until SIGINT or SIGTERM (under systemd: Type=notify). The data
directory holds the SQLite store (unless --db names a PostgreSQL server), the CA and
signing keys sealed with the key file, and the admin token, created when absent.

Every flag may also come from the environment: --hostname from
CELLVISOR_CONTROL_HOSTNAMES (a list, separated by commas or spaces), --listen
from CELLVISOR_CONTROL_LISTEN, --admin-listen from CELLVISOR_CONTROL_ADMIN_LISTEN,
--db from CELLVISOR_CONTROL_DB, and so on. A flag on the command line wins over
its variable. The systemd unit reads them from /etc/cellvisor/control.env.`,
		Example: "  cellvisor-control serve --data /var/lib/cellvisor-control --listen 0.0.0.0:8443 --hostname control.example.net",
		Args:    cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags(), os.LookupEnv); err != nil {
				return err
			}
			log, err := cli.NewLogger(format, level)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			c.Logger = log
			tokenFile := c.AdminTokenFile
			if tokenFile == "" {
				tokenFile = filepath.Join(c.Data, "admin.token")
			}
			ctx := cmd.Context()
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
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Data, "data", defaultData, "data directory: the SQLite database, the key file and the admin token")
	f.StringVar(&c.DB, "db", "", "postgres:// URL of the store; empty for <data>/control.db (SQLite)")
	f.StringVar(&c.Listen, "listen", "127.0.0.1:8443", "the edge-control API's address (TLS)")
	f.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8442", "the admin API's address (plain HTTP: loopback only, unless --admin-tls)")
	f.BoolVar(&c.AdminTLS, "admin-tls", false, "serve the admin API over TLS with the server certificate")
	f.Var((*listFlag)(&c.Hostnames), "hostname", "a DNS name or IP for the server certificate (repeatable; default localhost and loopback)")
	f.StringVar(&c.KeyFile, "key-file", "", "the key that seals keys at rest; empty for <data>/seal.key")
	f.StringVar(&c.AdminTokenFile, "admin-token-file", "", "the admin token, created when absent; empty for <data>/admin.token")
	f.StringVar(&c.MetricsTokenFile, "metrics-token-file", "", "the token that reads /metrics on the admin listener (and nothing else), created when absent; empty for <data>/metrics.token")
	f.DurationVar(&c.EgressLease, "egress-lease", controlapi.DefaultEgressLease,
		fmt.Sprintf("how long an egress lease lasts unless renewed (renewed every third of it), %s–%s", controlapi.MinEgressLease, controlapi.MaxEgressLease))
	f.IntVar(&c.EdgeLimits.MaxConns, "edge-max-conns", controlapi.DefaultEdgeMaxConns,
		"connections the edge-control listener holds at once (keep it under the unit's LimitNOFILE, about 80 KiB of memory each)")
	f.IntVar(&c.EdgeLimits.MaxPending, "edge-max-pending", controlapi.DefaultEdgeMaxPending,
		"of those, connections without a verified client certificate yet (mid-handshake, enrolling): at the cap the oldest is dropped for a new one")
	f.IntVar(&c.EdgeLimits.MaxConnsPerIP, "edge-max-conns-per-ip", 0,
		"connections one source address may hold on the edge-control listener; 0: no cap (edges may share NAT addresses)")
	f.DurationVar(&c.EdgeLimits.HandshakeTimeout, "edge-handshake-timeout", controlapi.DefaultEdgeHandshakeTimeout,
		"a connection to the edge-control listener not through its TLS handshake within it is closed (up to 1m)")
	f.DurationVar(&c.CertMargin, "cert-margin", controlapi.DefaultCertMargin,
		"a domain is published with its certificate only while the certificate is valid for at least this long")
	f.StringVar(&c.ACMEDirectory, "acme-directory", "",
		"the ACME directory URL (https) of the CA that issues the certificates of domains with tls.acme; empty: no ACME (docs/tls.md)")
	f.StringVar(&c.ACMEEmail, "acme-email", "", "the ACME account's contact email (optional)")
	f.StringVar(&c.ACMECAFile, "acme-ca-file", "", "a PEM bundle the ACME directory's certificate is verified against (a private CA); empty: the system roots")
	f.DurationVar(&c.StatusInterval, "status-interval", edgeapi.DefaultStatusInterval,
		fmt.Sprintf("the longest an agent goes without sending an unchanged status (changes are sent at once; the poll is the heartbeat), %s–%s", edgeapi.MinStatusInterval, edgeapi.MaxStatusInterval))
	f.IntVar(&c.PollWakeRate, "poll-wake-rate", controlapi.DefaultPollWakeRate,
		"held polls a publish wakes a second (spread over edges/rate seconds): higher reaches a fleet sooner, with its builds, acks and reports closer together")
	f.Var((*admissionFlag)(&c.Admission), "edge-admission",
		fmt.Sprintf("requests in work at once per request class on the edge-control listener, beyond which 429 (class=N,...; 1–%d each; default %s)", controlapi.MaxAdmission, controlapi.DefaultAdmission))
	f.StringVar(&format, "log-format", "json", "log encoding: json or console (coloured on a terminal)")
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}
