"""Writes the fixture machines under machines/ (run it after changing one: python tests/nodes/devices/make_machines.py).

Each machine is a /proc and /sys tree (root/) with recorded command outputs and library answers
(recorded/), read by nodes.devices.host.RecordedHost."""

import json
from pathlib import Path

BASE = Path(__file__).with_name("machines")


def write(machine, rel, text):
    p = BASE / machine / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def cpus(machine, n, core_of):
    for i in range(n):
        write(
            machine,
            f"root/sys/devices/system/cpu/cpu{i}/topology/core_cpus_list",
            core_of(i) + "\n",
        )


def cpuinfo(machine, brand, arch, flags, count):
    write(
        machine,
        "recorded/cpuinfo.json",
        json.dumps(
            {"brand_raw": brand, "arch_string_raw": arch, "flags": flags, "count": count}, indent=1
        ),
    )


XEON_FLAGS = sorted(
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni".split()
)
LLAMA_AVX512 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
LLAMA_AVX2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "


def meminfo(total_kib, avail_kib, huge=0):
    return (
        f"MemTotal:       {total_kib} kB\nMemFree:        {avail_kib} kB\nMemAvailable:   {avail_kib} kB\n"
        f"HugePages_Total:    {huge}\nHugePages_Free:     {huge}\nHugepagesize:       2048 kB\n"
    )


def dmi(machine, vendor, version, date, board):
    for k, v in {
        "bios_vendor": vendor,
        "bios_version": version,
        "bios_date": date,
        "board_vendor": "Supermicro",
        "board_name": board,
        "product_name": "SYS-" + board,
    }.items():
        write(machine, f"root/sys/class/dmi/id/{k}", v + "\n")


# 1. two NUMA nodes, AVX-512 with VNNI, a BMC's VGA (not an accelerator family we know)
m = "xeon-2numa-avx512"
cpuinfo(m, "Intel(R) Xeon(R) Gold 6338N CPU @ 2.20GHz", "x86_64", XEON_FLAGS, 16)
cpus(m, 16, lambda i: f"{i % 8 + (8 if i >= 8 else 0)}")  # no SMT: 16 physical
write(m, "root/proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nmicrocode\t: 0xd0003a5\n")
write(m, "root/proc/meminfo", meminfo(263_000_000, 250_000_000, huge=1024))
write(m, "root/proc/self/cgroup", "0::/system.slice/phalanx-node.service\n")
write(m, "root/sys/fs/cgroup/system.slice/phalanx-node.service/cpu.max", "max 100000\n")
for node, lst in ((0, "0-7"), (1, "8-15")):
    write(m, f"root/sys/devices/system/node/node{node}/cpulist", lst + "\n")
    write(
        m,
        f"root/sys/devices/system/node/node{node}/meminfo",
        f"Node {node} MemTotal:       131500000 kB\nNode {node} MemFree:        1000 kB\n",
    )
write(
    m,
    "root/proc/modules",
    "intel_rapl_msr 20480 0 - Live 0x0000000000000000\nixgbe 385024 0 - Live 0x0000000000000000\nast 65536 1 - Live 0x0000000000000000\n",
)
write(m, "root/sys/module/ixgbe/version", "5.19.6-k\n")
dmi(m, "American Megatrends International, LLC.", "1.4b", "05/17/2023", "X12DPi-NT6")
write(
    m,
    "recorded/memory.json",
    json.dumps({"total": 263_000_000 * 1024, "available": 250_000_000 * 1024}),
)
write(m, "recorded/affinity.json", json.dumps(list(range(16))))
write(m, "recorded/llama_system_info.txt", LLAMA_AVX512)
write(m, "recorded/kernel_release.txt", "6.1.0-28-amd64")
write(
    m,
    "recorded/commands.json",
    json.dumps(
        {
            "lspci -nn": {
                "status": "ok",
                "output": "00:00.0 Host bridge [0600]: Intel Corporation Ice Lake Memory Map/VT-d [8086:09a2] (rev 04)\n03:00.0 VGA compatible controller [0300]: ASPEED Technology, Inc. ASPEED Graphics Family [1a03:2000] (rev 52)\n18:00.0 Ethernet controller [0200]: Intel Corporation Ethernet Controller 10G X550T [8086:1563] (rev 01)\n",
            },
            "dmesg --level=emerg,alert,crit,err --notime": {"status": "ok", "output": ""},
        },
        indent=1,
    ),
)

# 2. an NVIDIA GPU (lspci, nvidia-smi, /sys/class/drm), llama.cpp built for the CPU only
m = "nvidia-l4"
cpuinfo(
    m,
    "AMD EPYC 9124 16-Core Processor",
    "x86_64",
    sorted("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2".split()),
    8,
)
cpus(m, 8, lambda i: f"{i % 4},{i % 4 + 4}")  # SMT: 4 physical cores
write(m, "root/proc/cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmicrocode\t: 0xa10113e\n")
write(m, "root/proc/meminfo", meminfo(65_000_000, 60_000_000))
write(m, "root/proc/self/cgroup", "0::/\n")
write(m, "root/sys/fs/cgroup/cpu.max", "max 100000\n")
write(m, "root/sys/devices/system/node/node0/cpulist", "0-7\n")
write(m, "root/sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       65000000 kB\n")
write(
    m,
    "root/proc/modules",
    "nvidia_uvm 1536000 0 - Live 0x0000000000000000 (POE)\nnvidia_drm 77824 0 - Live 0x0000000000000000 (POE)\nnvidia 56868864 2 nvidia_uvm,nvidia_drm, Live 0x0000000000000000 (POE)\n",
)
write(m, "root/sys/module/nvidia/version", "535.161.08\n")
write(m, "root/sys/module/nvidia_uvm/version", "535.161.08\n")
write(m, "root/sys/class/drm/card0/device/vendor", "0x10de\n")
write(m, "root/sys/class/drm/card0/device/device", "0x27b8\n")
write(m, "root/sys/class/drm/card0/device/uevent", "DRIVER=nvidia\nPCI_CLASS=30200\n")
dmi(m, "Dell Inc.", "2.3.5", "11/02/2024", "0VJ85P")
write(
    m,
    "recorded/memory.json",
    json.dumps({"total": 65_000_000 * 1024, "available": 60_000_000 * 1024}),
)
write(m, "recorded/affinity.json", json.dumps(list(range(8))))
write(m, "recorded/llama_system_info.txt", LLAMA_AVX2)
write(m, "recorded/kernel_release.txt", "6.1.0-28-amd64")
write(
    m,
    "recorded/commands.json",
    json.dumps(
        {
            "lspci -nn": {
                "status": "ok",
                "output": "00:00.0 Host bridge [0600]: Advanced Micro Devices, Inc. [AMD] Device [1022:14a4] (rev 01)\n41:00.0 3D controller [0302]: NVIDIA Corporation AD104GL [L4] [10de:27b8] (rev a1)\n",
            },
            "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader": {
                "status": "ok",
                "output": "NVIDIA L4, 535.161.08, 23034 MiB\n",
            },
            "dmesg --level=emerg,alert,crit,err --notime": {
                "status": "ok",
                "output": "NVRM: GPU 0000:41:00.0: RmInitAdapter failed! (0x24:0x65:1417)\nNVRM: GPU 0000:41:00.0: rm_init_adapter failed, device minor number 0\n",
            },
        },
        indent=1,
    ),
)

# 3. a container limited by its cgroup: 16 CPUs in its affinity, a quota of 2; dmesg refused,
#    no lspci, no DMI (a VM), no /proc/modules
m = "cgroup-limited"
cpuinfo(m, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "x86_64", XEON_FLAGS, 16)
cpus(m, 16, lambda i: f"{i % 8},{i % 8 + 8}")
write(m, "root/proc/cpuinfo", "processor\t: 0\nmicrocode\t: 0xd000390\n")
write(m, "root/proc/meminfo", meminfo(16_000_000, 2_000_000))
write(m, "root/proc/self/cgroup", "0::/kubepods/burstable/pod1234/cri-abc\n")
write(m, "root/sys/fs/cgroup/kubepods/burstable/pod1234/cri-abc/cpu.max", "200000 100000\n")
write(m, "root/sys/devices/system/node/node0/cpulist", "0-15\n")
write(
    m,
    "recorded/memory.json",
    json.dumps({"total": 16_000_000 * 1024, "available": 2_000_000 * 1024}),
)
write(m, "recorded/affinity.json", json.dumps(list(range(16))))
write(m, "recorded/llama_system_info.txt", LLAMA_AVX2)
write(m, "recorded/kernel_release.txt", "5.15.0-1051-aws")
write(
    m,
    "recorded/commands.json",
    json.dumps(
        {
            "dmesg --level=emerg,alert,crit,err --notime": {
                "status": "not_permitted",
                "output": "",
                "detail": "dmesg: read kernel buffer failed: Operation not permitted",
            },
        },
        indent=1,
    ),
)

# 4. everything odd: garbage in the files, recorded answers that are not JSON
m = "garbled"
write(m, "root/proc/meminfo", "\x00\x01 not meminfo\n")
write(m, "root/proc/self/cgroup", "garbage without colons\n")
write(m, "root/sys/fs/cgroup/cpu.max", "lots of words here\n")
write(m, "root/sys/devices/system/node/node0/cpulist", "zero-three\n")
write(m, "root/sys/devices/system/node/nodeX/cpulist", "0\n")
write(m, "root/sys/devices/system/cpu/cpu0/topology/core_cpus_list", "")
write(m, "root/sys/class/drm/card0/device/vendor", "")
write(m, "root/proc/modules", "\n\n")
write(m, "recorded/cpuinfo.json", "{not json")
write(m, "recorded/memory.json", "[1, 2]")
write(m, "recorded/affinity.json", '"all"')
write(m, "recorded/llama_system_info.txt", "||| = | : = |")
write(
    m,
    "recorded/commands.json",
    json.dumps(
        {
            "lspci -nn": {
                "status": "ok",
                "output": "garbage line\n01:00.0 VGA [03zz]: x [zzzz:1234]\n",
            },
            "dmesg --level=emerg,alert,crit,err --notime": {
                "status": "error",
                "detail": "dmesg: klogctl failed",
            },
        }
    ),
)
print("ok")
