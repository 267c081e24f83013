// Command kube-scheduler is kube-scheduler with gpu-scheduler's framework plugins
// compiled in (GPUScheduler, SpotScheduler, AZScheduler, GangPreemption), built per
// Kubernetes minor by tools/k8s/build.sh. Its profile names them (deploy/, the chart's
// plugins path).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/azscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/gangpreemption"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/gpuscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/spotscheduler"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(gpuscheduler.Name, gpuscheduler.New),
		app.WithPlugin(spotscheduler.Name, spotscheduler.New),
		app.WithPlugin(azscheduler.Name, azscheduler.New),
		app.WithPlugin(gangpreemption.Name, gangpreemption.New),
	)
	os.Exit(cli.Run(command))
}
