//go:build k8s1_34

package fakedra

import (
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"
)

// ExtendedResources turns DRAExtendedResource on for the test (alpha in 1.34, as the
// lab does): 1.34 maps a class to nvidia.com/gpu only with it.
func ExtendedResources(t testing.TB) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.DRAExtendedResource, true)
}
