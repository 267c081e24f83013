// Command k8s is one binary holding the Kubernetes components the tests, the demo and
// the install checks need: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet and kubectl (and helm, in the newest minor's build: helm.go).
// The component is the first argument (or the name the binary is called by).
//
// This file is shared by every supported minor's build: tools/k8s/v1.NN/ links it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
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
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// Version is the Kubernetes release this binary is built from; the Makefile sets it
// (-X main.Version) from the k8s.io/kubernetes line of the build's go.mod.
var Version = "unknown"

// components maps a component's name to its main; helm.go adds helm where it is built.
var components = map[string]func(args []string){
	"etcd": func(args []string) { etcdmain.Main(args) },
	"kube-apiserver": func([]string) {
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	},
	"kube-controller-manager": func([]string) {
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	},
	"kube-scheduler": func([]string) { os.Exit(cli.Run(scheduler.NewSchedulerCommand())) },
	"kubelet": func([]string) {
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	},
	"kubectl": func(args []string) {
		logs.GlogSetter(kubectl.GetLogVerbosity(args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	},
	"version": func([]string) { fmt.Println(Version) },
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "k8s" {
		if len(args) == 0 {
			usage()
		}
		name, args = args[0], args[1:]
	}
	run, ok := components[name]
	if !ok {
		usage()
	}
	// Each component parses os.Args itself; present it as if called by its own name.
	os.Args = append([]string{name}, args...)
	run(os.Args)
}

func usage() {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: k8s %s [flags]\n", strings.Join(names, "|"))
	os.Exit(2)
}
