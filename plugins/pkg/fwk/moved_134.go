//go:build k8s1_34

package fwk

import fw "k8s.io/kubernetes/pkg/scheduler/framework"

// The types that 1.34 still kept in k8s.io/kubernetes.
type (
	Handle              = fw.Handle
	Plugin              = fw.Plugin
	PreFilterPlugin     = fw.PreFilterPlugin
	FilterPlugin        = fw.FilterPlugin
	PreScorePlugin      = fw.PreScorePlugin
	ScorePlugin         = fw.ScorePlugin
	ReservePlugin       = fw.ReservePlugin
	PostBindPlugin      = fw.PostBindPlugin
	EnqueueExtensions   = fw.EnqueueExtensions
	PreFilterResult     = fw.PreFilterResult
	PreFilterExtensions = fw.PreFilterExtensions
	ScoreExtensions     = fw.ScoreExtensions
	NodeScoreList       = fw.NodeScoreList
	NodeScore           = fw.NodeScore
	PostFilterResult    = fw.PostFilterResult
	NodeToStatusReader  = fw.NodeToStatusReader
)

// MaxNodeScore is the highest score a Score plugin gives.
const MaxNodeScore = fw.MaxNodeScore
