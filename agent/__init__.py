"""The node agent: GPU inventory through NVML, published as node labels and capacity.

- :mod:`agent.inventory` reads the GPUs (NVML, or a YAML file with ``--fake-gpus``);
- :mod:`agent.labels` turns an inventory into labels, annotations and capacity (pure);
- :mod:`agent.sync` decides what to write to the Node, given what it has now (pure);
- :mod:`agent.kubeapi` and :mod:`agent.loop` are the edges: the API calls and the loop.
"""
