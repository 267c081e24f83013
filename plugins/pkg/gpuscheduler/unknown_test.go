package gpuscheduler

import "k8s.io/apimachinery/pkg/runtime"

// unknown is pluginConfig args as kube-scheduler hands an out-of-tree plugin its JSON.
func unknown(raw string) runtime.Object {
	return &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}
}
