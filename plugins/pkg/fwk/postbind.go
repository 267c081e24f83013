//go:build !k8s1_34

package fwk

import fw "k8s.io/kube-scheduler/framework"

// PostBindPlugin: after a pod is bound (GPUScheduler's GPUPlacement Event).
type PostBindPlugin = fw.PostBindPlugin
