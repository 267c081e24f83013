"""The local lab, apart from the product: a control plane compiled from the Kubernetes
Go modules (:mod:`lab.controlplane`), the processes it runs (:mod:`lab.processes`),
Node objects without kubelets (:mod:`lab.kubelet_shim`), the whole product on top
(:mod:`lab.stack`, which loads deploy/ as the one truth) and the demo (:mod:`lab.demo`,
``python -m lab``, which ``make demo`` runs). The image does not ship it; the tests,
the benchmarks and the demo use it.
"""
