"""Kubernetes API clients: kubeconfig when given, else in-cluster, else ~/.kube/config."""

from __future__ import annotations

from typing import Any


def api_client(kubeconfig: str | None = None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()


def core_api(kubeconfig: str | None = None) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig))
