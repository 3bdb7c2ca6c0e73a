package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func newTenantCmd(a *app) *cobra.Command {
	cmd := group("tenant", "Manage tenants and their quotas (admin)", "tenants")
	cmd.AddCommand(newTenantCreateCmd(a), newTenantLsCmd(a), newTenantRmCmd(a))
	return cmd
}

func newTenantCreateCmd(a *app) *cobra.Command {
	var t client.Tenant
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME [--sandboxes N] [--cpu C] [--memory M] [--disk D]",
		Short: "Create a tenant (quota 0 = unlimited)",
		Args:  exactArgs(1, "a tenant NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			t.Name = args[0]
			if t.Quota.Sandboxes < 0 || t.Quota.CPU < 0 {
				return usagef("quotas must not be negative")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			out, err := c.CreateTenant(cmd.Context(), t)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintln(a.stdout, out.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&t.Quota.Sandboxes, "sandboxes", 0, "max sandboxes held at once")
	f.Float64Var(&t.Quota.CPU, "cpu", 0, "max CPU cores requested at once")
	f.Var(sizeValue{&t.Quota.MemoryBytes}, "memory", "max memory, e.g. 64Gi")
	f.Var(sizeValue{&t.Quota.DiskBytes}, "disk", "max disk, e.g. 500Gi")
	f.BoolVar(&t.Admin, "admin", false, "make the tenant an administrator")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func quotaStr(n int64, f func(int64) string) string {
	if n == 0 {
		return "-"
	}
	return f(n)
}

func newTenantLsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List tenants",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTenants(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if ts == nil {
					ts = []client.Tenant{}
				}
				return printJSON(a.stdout, ts)
			}
			now := time.Now()
			t := newTable(a.stdout, "NAME", "SANDBOXES", "CPU", "MEMORY", "DISK", "ADMIN", "CREATED")
			for _, tn := range ts {
				q := tn.Quota
				t.row(tn.Name, quotaStr(int64(q.Sandboxes), func(n int64) string { return fmt.Sprint(n) }),
					orDash(fmt.Sprintf("%g", q.CPU)), quotaStr(q.MemoryBytes, formatSize), quotaStr(q.DiskBytes, formatSize),
					tn.Admin, age(tn.CreatedAt, now))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTenantRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a tenant",
		Args:    exactArgs(1, "a tenant NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteTenant(cmd.Context(), args[0])
		},
	}
}

func newTokenCmd(a *app) *cobra.Command {
	cmd := group("token", "Issue and revoke API tokens (admin)", "tokens")
	var tenant string
	var e2b, asJSON bool
	create := &cobra.Command{
		Use:   "create --tenant NAME [--e2b]",
		Short: "Issue a token; its secret is printed once",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant == "" {
				return usagef("--tenant is required")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			tok, err := c.CreateToken(cmd.Context(), tenant, client.TokenOptions{E2B: e2b})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, tok)
			}
			// The secret alone on stdout, so `$(dsec token create ...)` works.
			fmt.Fprintf(a.stderr, "token %s for tenant %s (the secret is shown only once)\n", tok.ID, tok.Tenant)
			if e2b {
				fmt.Fprintln(a.stderr, "use it as E2B_API_KEY with the E2B SDK")
			}
			fmt.Fprintln(a.stdout, tok.Secret)
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant the token acts for (required)")
	create.Flags().BoolVar(&e2b, "e2b", false, "issue an E2B-style API key (e2b_...)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON (id, tenant, secret)")
	revoke := &cobra.Command{
		Use:     "revoke ID",
		Aliases: []string{"rm"},
		Short:   "Revoke a token",
		Args:    exactArgs(1, "a token ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.RevokeToken(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, revoke)
	return cmd
}
