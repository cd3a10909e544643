"""Which NVML device is a rank's CUDA device. NVML numbers GPUs like nvidia-smi (PCI bus order) and ignores
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER; CUDA applies both, and accepts GPU UUIDs (or unique prefixes) and MIG
instances in CUDA_VISIBLE_DEVICES. The UUID the trainer reads from CUDA settles it; without one, this module reads
the environment as CUDA does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


class Unmapped(LookupError):
    """The CUDA device cannot be found in NVML; the message says why (shown as "not available: ...")."""


@dataclass(frozen=True)
class Target:
    """An NVML device to read: `index` is the nvidia-smi index of the physical GPU (a MIG instance's parent)."""

    index: int
    handle: Any
    uuid: str


def find(nvml: Any, cuda_index: int, uuid: str | None, env: Mapping[str, str]) -> Target:
    """The NVML device of CUDA device `cuda_index` of this process (`uuid`: what CUDA says about it)."""
    if uuid:
        return _by_uuid(nvml, uuid)
    entries = _visible(nvml, env)
    if cuda_index >= len(entries):
        raise Unmapped(f"no GPU with index {cuda_index} ({len(entries)} visible)")
    return _entry(nvml, entries[cuda_index], env)


def _by_uuid(nvml: Any, uuid: str) -> Target:
    bare = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
    # CUDA's bytes carry no prefix; the prefixed names come first, so that the UUID shown is nvidia-smi's (a real
    # driver, 580 on an H200, also answers the bare form: the recording then showed a UUID nvidia-smi never prints)
    for name in dict.fromkeys((f"GPU-{bare}", f"MIG-{bare}", uuid) if bare == uuid else (uuid,)):
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError:
            continue
        return Target(_physical_index(nvml, handle), handle, name)
    raise Unmapped(f"no GPU with UUID {uuid}")


def _physical_index(nvml: Any, handle: Any) -> int:
    try:
        if nvml.nvmlDeviceIsMigDeviceHandle(handle):
            handle = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    except (nvml.NVMLError, AttributeError):  # drivers before MIG (R450) have no such call
        pass
    return nvml.nvmlDeviceGetIndex(handle)


def _visible(nvml: Any, env: Mapping[str, str]) -> list[str]:
    """CUDA's device list as entries: what CUDA_VISIBLE_DEVICES names, up to the first invalid one (CUDA ignores
    the rest), else every GPU as an index."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def _entry(nvml: Any, entry: str, env: Mapping[str, str]) -> Target:
    if entry.startswith("MIG-GPU-"):  # the pre-R470 form: MIG-GPU-<uuid>/<gpu instance>/<compute instance>
        return _mig_by_ids(nvml, entry)
    if entry.startswith("MIG-"):
        return _by_uuid(nvml, entry)
    if entry.startswith("GPU-"):
        return _by_prefix(nvml, entry)
    return _by_order(nvml, int(entry), env)


def _uuids(nvml: Any) -> list[tuple[int, Any, str]]:
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        out.append((index, handle, _text(nvml.nvmlDeviceGetUUID(handle))))
    return out


def _by_prefix(nvml: Any, prefix: str) -> Target:
    matches = [(i, h, u) for i, h, u in _uuids(nvml) if u.startswith(prefix)]
    if len(matches) != 1:
        raise Unmapped(f"CUDA_VISIBLE_DEVICES names {prefix}, which matches {len(matches)} GPUs")
    return Target(*matches[0])


def _by_order(nvml: Any, position: int, env: Mapping[str, str]) -> Target:
    """The `position`-th GPU in CUDA's order. PCI_BUS_ID is NVML's order; CUDA's default, FASTEST_FIRST, equals it
    when every GPU is the same model (ties go by PCI bus id) and is unknowable from NVML otherwise."""
    count = nvml.nvmlDeviceGetCount()
    if position >= count:
        raise Unmapped(f"CUDA_VISIBLE_DEVICES names GPU {position}, and there are {count}")
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
        names = {_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
        if len(names) > 1:
            raise Unmapped(f"GPUs of {len(names)} models in CUDA's FASTEST_FIRST order cannot be matched to NVML's: "
                           "set CUDA_DEVICE_ORDER=PCI_BUS_ID")
    handle = nvml.nvmlDeviceGetHandleByIndex(position)
    return Target(position, handle, _text(nvml.nvmlDeviceGetUUID(handle)))


def _mig_by_ids(nvml: Any, entry: str) -> Target:
    parts = entry[len("MIG-"):].split("/")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise Unmapped(f"cannot read the MIG device {entry}")
    parent = _by_prefix(nvml, parts[0])
    gi, ci = int(parts[1]), int(parts[2])
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent.handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
        except nvml.NVMLError:  # an empty slot
            continue
        if (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (gi, ci):
            return Target(parent.index, mig, _text(nvml.nvmlDeviceGetUUID(mig)))
    raise Unmapped(f"no MIG instance {gi}/{ci} on GPU {parent.index}")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
