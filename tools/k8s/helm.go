package main

import (
	"errors"
	"fmt"
	"os"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
	helmkube "helm.sh/helm/v4/pkg/kube"
)

// helm is a client: the newest minor's build carries it, and the lab uses that one
// against a control plane of any supported minor.
func init() { components["helm"] = runHelm }

// runHelm is cmd/helm's main from helm.sh/helm/v4.
func runHelm(args []string) {
	helmkube.ManagedFieldsManager = "helm"
	cmd, err := helmcmd.NewRootCmd(os.Stdout, args[1:], helmcmd.SetupLogging)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := cmd.Execute(); err != nil {
		if cerr, ok := errors.AsType[helmcmd.CommandError](err); ok {
			os.Exit(cerr.ExitCode)
		}
		os.Exit(1)
	}
}
