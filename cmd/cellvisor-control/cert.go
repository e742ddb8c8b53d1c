package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
)

// maxPEM bounds a certificate chain or key file read for cert add; the
// control API refuses far smaller ones, naming the rule.
const maxPEM = 1 << 20

func readPEM(what, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPEM+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if len(data) > maxPEM {
		return "", fmt.Errorf("%s %s: larger than %d bytes", what, path, maxPEM)
	}
	return string(data), nil
}

func (c *app) certCmd() *cobra.Command {
	cert := &cobra.Command{Use: "cert", Short: "upload, list, show and delete the certificates domains serve HTTPS with"}
	cert.AddCommand(c.certAdd(), c.certList(), c.certShow(), c.certDelete())
	return cert
}

func (c *app) certAdd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add NAME --cert chain.pem --key key.pem [--replace]",
		Short: "upload a certificate chain and its private key",
		Long: `Upload a certificate chain (PEM, leaf first, each certificate followed by its issuer)
and the leaf's private key (PEM) under NAME, which a domain names as "tls": {"certificate": NAME}.
The key is stored encrypted and never shown again. With --replace a certificate of that name
is replaced and every domain that uses it is published again with the new one.`,
		Example: `  cellvisor-control cert add shop --cert shop-chain.pem --key shop-key.pem
  cellvisor-control cert add shop --cert renewed-chain.pem --key renewed-key.pem --replace`,
		Args: cli.ExactArgs(1),
	}
	certFile := cmd.Flags().String("cert", "", "the certificate chain, PEM, leaf first (required)")
	keyFile := cmd.Flags().String("key", "", "the leaf's private key, PEM (required)")
	replace := cmd.Flags().Bool("replace", false, "replace a certificate of that name and republish the domains that use it")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.CertificateView, error) {
		if *certFile == "" || *keyFile == "" {
			return adminapi.CertificateView{}, errors.New("--cert and --key are required")
		}
		chain, err := readPEM("certificate chain", *certFile)
		if err != nil {
			return adminapi.CertificateView{}, err
		}
		key, err := readPEM("private key", *keyFile)
		if err != nil {
			return adminapi.CertificateView{}, err
		}
		return ac.PutCertificate(ctx, args[0], adminapi.CertificateRequest{Chain: chain, Key: key, Replace: *replace})
	}, printCert)
}

// printCert shows a certificate: never its key (the control API has no
// answer that carries one).
func printCert(w io.Writer, v adminapi.CertificateView, now time.Time) error {
	fmt.Fprintf(w, "certificate %s\n", v.Name)
	fmt.Fprintf(w, "  fingerprint  %s\n", v.Fingerprint)
	fmt.Fprintf(w, "  names        %s\n", strings.Join(v.Names, ", "))
	fmt.Fprintf(w, "  issuer       %s\n", v.Issuer)
	fmt.Fprintf(w, "  key type     %s\n", v.KeyType)
	fmt.Fprintf(w, "  not before   %s\n", v.NotBefore.Format(time.RFC3339))
	fmt.Fprintf(w, "  not after    %s (%s)\n", v.NotAfter.Format(time.RFC3339), expiresIn(v.NotAfter, now))
	if len(v.UsedBy) > 0 {
		fmt.Fprintf(w, "  used by      %s\n", strings.Join(v.UsedBy, ", "))
	}
	for _, d := range slices.Sorted(maps.Keys(v.Republished)) {
		fmt.Fprintf(w, "  republished  %s at revision %d\n", d, v.Republished[d])
	}
	for _, d := range slices.Sorted(maps.Keys(v.Failed)) {
		fmt.Fprintf(w, "  NOT republished %s: %s\n", d, v.Failed[d])
	}
	return nil
}

// expiresIn says how long until t, in days.
func expiresIn(t, now time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return "expired"
	}
	return fmt.Sprintf("%d days left", int(d.Hours()/24))
}

func (c *app) certList() *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "list", Short: "list the certificates", Args: cli.ExactArgs(0)},
		func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.CertificateView, error) {
			return ac.Certificates(ctx)
		}, "NAME\tFINGERPRINT\tNAMES\tNOT AFTER\tEXPIRES\tUSED BY", func(v adminapi.CertificateView, now time.Time) string {
			return fmt.Sprintf("%s\t%.16s\t%s\t%s\t%s\t%s", v.Name, v.Fingerprint, strings.Join(v.Names, ","),
				v.NotAfter.Format(time.RFC3339), expiresIn(v.NotAfter, now), strings.Join(v.UsedBy, ","))
		})
}

func (c *app) certShow() *cobra.Command {
	return oneCmd(c, &cobra.Command{Use: "show NAME", Short: "show a certificate (never its key)", Args: cli.ExactArgs(1)},
		func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.CertificateView, error) {
			return ac.Certificate(ctx, args[0])
		}, printCert)
}

func (c *app) certDelete() *cobra.Command {
	return c.adminCmd(&cobra.Command{
		Use:   "delete NAME",
		Short: "delete a certificate and its key; refused while a domain uses it",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) error {
		if err := ac.DeleteCertificate(ctx, args[0]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(c.out, "deleted certificate %s\n", args[0])
		return err
	})
}
