"""Inventory read from fixture machines (``machines/``: /proc and /sys trees with recorded
command outputs) and from this machine."""

from __future__ import annotations

import json

from nodes.devices.accelerators import parse_lspci
from nodes.devices.host import LocalHost, RecordedHost
from nodes.devices.inventory import collect, diff, fingerprint
from nodes.devices.sysfs import parse_cpu_list


def test_it_reads_two_numa_nodes_and_avx512(machine):
    inv = collect(machine("xeon-2numa-avx512"))
    assert inv["cpu"]["model"] == "Intel(R) Xeon(R) Gold 6338N CPU @ 2.20GHz"
    assert {"avx512f", "avx512_vnni"} <= set(inv["cpu"]["flags"])
    assert (inv["cpu"]["logical"], inv["cpu"]["physical"]) == (16, 16)
    assert inv["cpu"]["microcode"] == "0xd0003a5"
    assert [(n["node"], n["cpus"]) for n in inv["numa"]] == [
        (0, list(range(8))),
        (1, list(range(8, 16))),
    ]
    assert inv["numa"][1]["memory_bytes"] == 131_500_000 * 1024
    assert inv["hugepages"] == {"total": 1024, "free": 1024, "size_kib": 2048}
    assert inv["cpu_budget"] == {
        "affinity": list(range(16)),
        "cgroup_cpus": None,  # cpu.max says "max": no quota
        "cgroup_source": None,
        "cpus": 16.0,
    }
    assert inv["llama"]["backends"] == ["CPU"]
    assert inv["llama"]["features"]["AVX512_VNNI"] == "1"
    assert inv["modules"]["loaded"] == {"intel_rapl_msr": "", "ixgbe": "5.19.6-k", "ast": ""}
    assert inv["firmware"]["bios_version"] == "1.4b"
    assert inv["kernel"] == {"release": "6.1.0-28-amd64"}
    assert inv["kernel_errors"] == {"status": "ok", "detail": "", "count": 0, "lines": []}
    # the BMC's VGA is a display controller: listed, though no accelerator family of ours
    assert [d["vendor_id"] for d in inv["accelerators"]["pci"]] == ["1a03"]


def test_it_reads_an_nvidia_gpu(machine):
    inv = collect(machine("nvidia-l4"))
    acc = inv["accelerators"]
    assert acc["pci"] == [
        {
            "slot": "41:00.0",
            "class": "3D controller",
            "class_code": "0302",
            "vendor_id": "10de",
            "device_id": "27b8",
            "name": "NVIDIA Corporation AD104GL [L4]",
        }
    ]
    assert acc["drm"] == [
        {"card": "card0", "vendor_id": "10de", "device_id": "27b8", "driver": "nvidia"}
    ]
    assert acc["nvidia_smi"]["gpus"] == [
        {"name": "NVIDIA L4", "driver_version": "535.161.08", "memory": "23034 MiB"}
    ]
    assert inv["modules"]["loaded"]["nvidia"] == "535.161.08"
    assert inv["cpu"] == {
        "model": "AMD EPYC 9124 16-Core Processor",
        "arch": "x86_64",
        "flags": ["avx", "avx2", "bmi2", "f16c", "fma", "fpu"]
        + ["sse", "sse2", "sse4_1", "sse4_2", "ssse3"],
        "logical": 8,
        "physical": 4,
        "microcode": "0xa10113e",
    }
    assert inv["cpu_budget"] == {
        "affinity": list(range(8)),
        "cgroup_cpus": None,
        "cgroup_source": None,
        "cpus": 8.0,
    }
    assert inv["memory"]["total"] == 66_560_000_000
    assert inv["kernel_errors"]["count"] == 2
    assert inv["kernel_errors"]["lines"][0].startswith(
        "NVRM: GPU 0000:41:00.0: RmInitAdapter failed"
    )


def test_it_reads_the_cgroup_quota_not_the_hosts_cpus(machine):
    inv = collect(machine("cgroup-limited"))
    budget = inv["cpu_budget"]
    assert len(budget["affinity"]) == 16
    assert budget["cgroup_cpus"] == 2.0
    assert budget["cgroup_source"] == "/sys/fs/cgroup/kubepods/burstable/pod1234/cri-abc/cpu.max"
    assert budget["cpus"] == 2.0
    assert inv["kernel_errors"]["status"] == "not_permitted"
    assert "Operation not permitted" in inv["kernel_errors"]["detail"]
    assert inv["accelerators"]["lspci"]["status"] == "not_found"
    assert inv["modules"]["status"] == "unknown"
    assert set(inv["firmware"].values()) == {None}


def test_it_reads_a_cgroup_v1_quota(machine_copy):
    path = machine_copy("cgroup-limited")
    (path / "root/proc/self/cgroup").write_text("4:cpu,cpuacct:/docker/abc\n0::/\n")
    v1 = path / "root/sys/fs/cgroup/cpu/docker/abc"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (path / "root/sys/fs/cgroup/kubepods/burstable/pod1234/cri-abc/cpu.max").unlink()
    budget = collect(RecordedHost(path))["cpu_budget"]
    assert (budget["cgroup_cpus"], budget["cpus"]) == (1.5, 1.5)


def test_it_says_unknown_for_garbage_instead_of_crashing(machine):
    inv = collect(machine("garbled"))
    assert inv["cpu"]["model"] is None and inv["cpu"]["flags"] == []
    assert inv["cpu_budget"]["cpus"] is None
    assert inv["numa"] == [{"node": 0, "cpus": [], "memory_bytes": None}]
    assert inv["memory"] == {"cgroup_limit": None, "cgroup_usage": None}
    assert inv["hugepages"] == {"total": None, "free": None, "size_kib": None}
    assert inv["accelerators"]["pci"] == []
    assert inv["accelerators"]["drm"] == [
        {"card": "card0", "vendor_id": None, "device_id": None, "driver": None}
    ]
    assert inv["kernel_errors"]["status"] == "error" and inv["kernel_errors"]["count"] is None
    json.dumps(inv)  # still plain JSON
    fingerprint(inv)


def test_it_says_unknown_for_a_machine_with_nothing(tmp_path):
    inv = collect(RecordedHost(tmp_path))
    assert inv["cpu"]["logical"] is None and inv["numa"] == []
    assert inv["modules"]["status"] == "unknown"
    assert inv["kernel_errors"]["status"] == "not_found"
    assert inv["llama"] == {"text": None, "features": {}, "backends": []}


def _proc_cpuinfo(key: str) -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith(key))


def test_it_reads_this_machine_as_the_kernel_describes_it():
    """What a person checks against ``/proc/cpuinfo``, ``nproc``, ``free`` and ``uname -r``."""
    import os
    import platform

    import psutil

    inv = collect(LocalHost())
    assert inv["cpu"]["model"] == _proc_cpuinfo("model name")
    assert inv["cpu"]["arch"] == platform.machine()
    simd = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "amx_tile"}
    assert simd & set(inv["cpu"]["flags"]) == simd & set(_proc_cpuinfo("flags").split())
    assert inv["cpu"]["logical"] == os.cpu_count()
    assert inv["cpu_budget"]["affinity"] == sorted(os.sched_getaffinity(0))
    assert inv["memory"]["total"] == psutil.virtual_memory().total
    assert inv["kernel"] == {"release": platform.release()}
    assert "CPU" in inv["llama"]["backends"]  # the build make installs has no GPU backend


def test_it_lists_a_firmware_and_module_change_in_the_diff(machine, machine_copy):
    before = collect(machine("nvidia-l4"))
    path = machine_copy("nvidia-l4")
    (path / "root/sys/class/dmi/id/bios_version").write_text("2.4.1\n")
    (path / "root/sys/module/nvidia/version").write_text("550.54.15\n")
    after = collect(RecordedHost(path))
    assert fingerprint(before) != fingerprint(after)
    assert diff(before, after) == [
        {"path": "firmware.bios_version", "before": "2.3.5", "after": "2.4.1"},
        {"path": "modules.nvidia", "before": "535.161.08", "after": "550.54.15"},
    ]


def test_it_keeps_the_fingerprint_when_only_free_memory_moves(machine, machine_copy):
    before = collect(machine("nvidia-l4"))
    path = machine_copy("nvidia-l4")
    (path / "recorded/memory.json").write_text(
        json.dumps({"total": 65_000_000 * 1024, "available": 1})
    )
    assert fingerprint(collect(RecordedHost(path))) == fingerprint(before)


def test_it_parses_cpu_lists_and_lspci_lines():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("x") == [] and parse_cpu_list(None) == []
    line = "c1:00.0 Processing accelerators [1200]: Habana Labs Ltd. Gaudi2 [1da3:1020] (rev 01)"
    assert parse_lspci(line)[0]["vendor_id"] == "1da3"
    assert parse_lspci("00:1f.3 Audio device [0403]: Intel Corporation [8086:a348]") == []


def test_it_says_what_a_list_gained_and_lost(machine):
    before = collect(machine("nvidia-l4"))
    after = collect(machine("nvidia-l4"))
    after["cpu"]["flags"] = [f for f in after["cpu"]["flags"] if f != "avx2"] + ["avx512f"]
    (change,) = diff(before, after)
    assert (change["path"], change["added"], change["removed"]) == (
        "cpu.flags",
        ["avx512f"],
        ["avx2"],
    )


def test_it_reads_memory_and_cpu_limits_set_on_a_parent_cgroup(machine_copy):
    path = machine_copy("cgroup-limited")
    pod = path / "root/sys/fs/cgroup/kubepods/burstable/pod1234"
    (pod / "cpu.max").write_text("150000 100000\n")  # tighter than the container's 2 CPUs
    (pod / "memory.max").write_text(f"{4 << 30}\n")
    (pod / "memory.current").write_text(f"{1 << 30}\n")
    (pod / "cri-abc/memory.max").write_text("max\n")
    inv = collect(RecordedHost(path))
    assert inv["cpu_budget"]["cgroup_cpus"] == 1.5
    assert inv["cpu_budget"]["cgroup_source"].endswith("pod1234/cpu.max")
    assert (inv["memory"]["cgroup_limit"], inv["memory"]["cgroup_usage"]) == (4 << 30, 1 << 30)


def test_a_routine_module_load_is_not_a_change(machine, machine_copy):
    before = collect(machine("nvidia-l4"))
    path = machine_copy("nvidia-l4")
    with open(path / "root/proc/modules", "a") as modules:
        modules.write("veth 36864 0 - Live 0x0000000000000000\n")
    after = collect(RecordedHost(path))
    assert "veth" in after["modules"]["loaded"]
    assert fingerprint(after) == fingerprint(before)


def test_it_summarises_an_inventory_for_a_person_and_survives_odd_shapes(machine):
    from nodes.devices.summary import summary

    rows = dict(summary(collect(machine("cgroup-limited"))))
    assert rows["CPU budget"] == "2.0 (affinity 0-15, cgroup 2.0)"
    assert rows["Kernel errors"].startswith("unknown: dmesg: read kernel buffer failed")
    assert rows["Firmware"] == "unknown (no /sys/class/dmi)"
    odd = dict(summary({"cpu": "x86", "numa": [{}], "memory": [1]}))
    assert odd["CPU"] == "unknown (?)" and odd["Memory"] == "unknown total, unknown available"
