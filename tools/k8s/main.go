// Command k8s is one binary holding the control-plane components the tests need:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
// The component is the first argument (or the name the binary is called by).
package main

import (
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
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: k8s etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|version [flags]"

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
