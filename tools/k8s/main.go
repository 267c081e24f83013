// Command k8s is one binary holding the Kubernetes components the tests, the demo and
// the install checks need: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet, kubectl and helm. The component is the first argument (or
// the name the binary is called by).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata"

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	helmkube "helm.sh/helm/v4/pkg/kube"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

const usage = "usage: k8s etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl|helm|version [flags]"

// Version is the Kubernetes release this binary is built from (kept in step with go.mod).
const Version = "v1.37.2"

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "k8s" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// Each component parses os.Args itself; present it as if called by its own name.
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "helm":
		runHelm(os.Args[1:])
	case "kubectl":
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	case "version":
		fmt.Println(Version)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// runHelm is cmd/helm's main from helm.sh/helm/v4.
func runHelm(args []string) {
	helmkube.ManagedFieldsManager = "helm"
	cmd, err := helmcmd.NewRootCmd(os.Stdout, args, helmcmd.SetupLogging)
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
