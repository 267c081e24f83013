"""The device plugin's wire contract: the checked-in modules are what
tools/gen_deviceplugin.py makes of api.proto, and api.proto is the kubelet's
deviceplugin/v1beta1 (package, services, field names and numbers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from google.protobuf import descriptor_pb2

from agent.deviceplugin import api_pb2, api_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]

#: deviceplugin/v1beta1 as the kubelet speaks it: message -> {field: (number, repeated)}.
FIELDS = {
    "DevicePluginOptions": {
        "pre_start_required": (1, 0),
        "get_preferred_allocation_available": (2, 0),
    },
    "RegisterRequest": {
        "version": (1, 0),
        "endpoint": (2, 0),
        "resource_name": (3, 0),
        "options": (4, 0),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, 1)},
    "TopologyInfo": {"nodes": (1, 1)},
    "NUMANode": {"ID": (1, 0)},
    "Device": {"ID": (1, 0), "health": (2, 0), "topology": (3, 0)},
    "PreStartContainerRequest": {"devices_ids": (1, 1)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": (1, 1)},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, 1),
        "must_include_deviceIDs": (2, 1),
        "allocation_size": (3, 0),
    },
    "PreferredAllocationResponse": {"container_responses": (1, 1)},
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, 1)},
    "AllocateRequest": {"container_requests": (1, 1)},
    "ContainerAllocateRequest": {"devices_ids": (1, 1)},
    "CDIDevice": {"name": (1, 0)},
    "AllocateResponse": {"container_responses": (1, 1)},
    "ContainerAllocateResponse": {
        "envs": (1, 1),
        "mounts": (2, 1),
        "devices": (3, 1),
        "annotations": (4, 1),
        "cdi_devices": (5, 1),
    },
    "Mount": {"container_path": (1, 0), "host_path": (2, 0), "read_only": (3, 0)},
    "DeviceSpec": {"container_path": (1, 0), "host_path": (2, 0), "permissions": (3, 0)},
}
METHODS = {
    "Registration": ["Register"],
    "DevicePlugin": [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ],
}


def test_the_proto_is_the_kubelets_v1beta1():
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1beta1"
    assert set(file.message_types_by_name) == set(FIELDS)
    for name, fields in FIELDS.items():
        message = file.message_types_by_name[name]
        seen = {f.name: (f.number, int(f.is_repeated)) for f in message.fields}
        assert seen == fields, name
    assert {n: [m.name for m in s.methods] for n, s in file.services_by_name.items()} == METHODS
    stream = file.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert stream.output_type.name == "ListAndWatchResponse"
    assert api_pb2_grpc.DevicePluginStub and api_pb2_grpc.RegistrationServicer


def test_the_generated_modules_are_what_the_script_makes_of_the_proto(tmp_path):
    spec = importlib.util.spec_from_file_location("gen", ROOT / "tools" / "gen_deviceplugin.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    files = gen.generate(tmp_path)
    assert set(files) == {"api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"}
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    assert protoc.main(["protoc", f"-I{ROOT}", f"--descriptor_set_out={out}", str(gen.PROTO)]) == 0
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _without_json_names(fresh.message_type)  # protoc's set has them, gencode does not
    checked_in = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    assert checked_in == fresh, "api.proto changed: run tools/gen_deviceplugin.py"
    here = ROOT / "agent" / "deviceplugin" / "api_pb2_grpc.py"
    methods = [line.strip() for line in here.read_text().splitlines() if "'/v1beta1." in line]
    made = [line.strip() for line in files["api_pb2_grpc.py"].splitlines() if "'/v1beta1." in line]
    assert methods == made


def _without_json_names(messages) -> None:
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _without_json_names(message.nested_type)
