//go:build !k8s1_34

package fwk

import fw "k8s.io/kube-scheduler/framework"

// The types that moved to the staging module in 1.35.
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
	// SignPlugin and SignFragment: batching of alike pods (1.35+).
	SignPlugin   = fw.SignPlugin
	SignFragment = fw.SignFragment
)

// MaxNodeScore is the highest score a Score plugin gives.
const MaxNodeScore = fw.MaxNodeScore
