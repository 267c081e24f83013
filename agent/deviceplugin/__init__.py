"""The kubelet device plugin (API ``deviceplugin/v1beta1``) the agent serves on GPU
sharing nodes (label ``gpu-scheduler.io/gpu-sharing``: ``mps`` or ``time-slicing``).

It serves two resources, each on its own socket in the kubelet's device-plugin
directory: ``gpu-scheduler.io/gpu-memory`` (IDs ``<GPU UUID>::<k>``, one per GiB of a
GPU) and ``nvidia.com/gpu`` (IDs: the GPUs' UUIDs), so one node takes both whole-GPU
pods and shares, never of the same GPU at once. NVIDIA's device plugin must not run
on such a node.

- :mod:`.devices`: the decisions, no I/O: device lists, health and overlap, the
  preferred allocations (:func:`gpu_scheduler.sharing.fit`), Allocate's checks and
  answers.
- :mod:`.state`: the injected sources (GPUs, health, what is allocated) and the lists.
- :mod:`.server`: the gRPC service of one resource and its unix-socket server.
- :mod:`.register`: registration with the kubelet, again after each kubelet restart.
- :mod:`.runner`: :class:`~agent.deviceplugin.runner.DevicePlugin`, what the agent
  starts and stops.
- ``api.proto``: the wire contract; ``api_pb2*.py`` are generated from it by
  ``tools/gen_deviceplugin.py``.
"""
