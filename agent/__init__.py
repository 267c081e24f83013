"""The node agent: GPU inventory through NVML, published as node labels and capacity.

- :mod:`agent.inventory` is what a node has; :mod:`agent.nvml` reads it (or
  :mod:`agent.fake`, a YAML file with ``--fake-gpus``), :mod:`agent.events` hears its
  XIDs, :mod:`agent.health` keeps what they said;
- :mod:`agent.labels` turns an inventory into labels, annotations and capacity (pure);
- :mod:`agent.sync` decides what to write to the Node, given what it has now (pure);
- :mod:`agent.kubeapi` and :mod:`agent.loop` are the edges: the API calls and the loop.
"""
