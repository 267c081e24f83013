"""The kube-scheduler extender: filters and scores nodes for GPU pods (extender v1 JSON)."""
