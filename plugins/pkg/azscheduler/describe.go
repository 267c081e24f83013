package azscheduler

import (
	"fmt"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Describe is the GPUPlacement Event's words for a node with these labels: the
// tightest level at which it shares a domain with the group, and how many of the
// group's pods are there (extender/policies/group.py, describe); "" where it shares none.
func (g *Group) Describe(labels map[string]string) string {
	for i, level := range g.levels {
		value := labels[level]
		if value == "" {
			continue
		}
		if count := g.domains[i][value]; count > 0 {
			return fmt.Sprintf("%d of its group's %d placed pods in %s=%s", count, g.members, level, value)
		}
	}
	return ""
}

// Placement is the group this cycle scored by, or nil (no group, or placed nowhere yet).
func Placement(cs fwk.CycleState) *Group {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	group, _ := data.(*Group)
	return group
}
