"""The compatibility matrix applied to the fixture machines: each gives the expected results."""

from __future__ import annotations

import copy

import pytest

from nodes.devices.inventory import collect
from nodes.devices.matrix import Facts, evaluate, load_matrix, overall

ENGINE = {
    "threads": 8,
    "sequences": 8,
    "ctx_per_seq": 2048,
    "kv_bytes_per_token": 98_304,  # 24 layers x 8 KV heads x 128 x (K+V) x f16 / 2
    "model_bytes": 100 << 20,
    "host_ram_bytes": 256 << 20,
    "held_bytes": 600 << 20,
    "quantization": "Q4_K_M",
}
BENCH = {"decode_tok_s_8": 300.0}


def results(inventory, engine=None, bench=None, pool=None):
    facts = Facts(inventory, {**ENGINE, **(engine or {})}, bench or BENCH, pool)
    return {r.rule: (r.status, r.reason) for r in evaluate(facts)}


def statuses(found):
    return {rule: status for rule, (status, _) in found.items()}


def test_it_warns_when_a_node_spans_two_numa_nodes(machine):
    found = results(collect(machine("xeon-2numa-avx512")))
    assert statuses(found) == {
        "cpu.required": "pass",
        "cpu.recommended": "pass",
        "cpu.build": "pass",
        "quantization.repack": "pass",
        "memory": "pass",
        "threads": "pass",
        "numa": "warn",
        "kernel_errors": "pass",
        "accelerators": "pass",
        "pool": "pass",
    }
    assert "span NUMA nodes 0, 1" in found["numa"][1]
    assert "lacks avx_vnni, amx_int8" in found["cpu.recommended"][1]


def test_it_passes_a_node_pinned_to_one_numa_node(machine):
    inventory = collect(machine("xeon-2numa-avx512"))
    inventory["cpu_budget"]["affinity"] = list(range(8, 16))
    found = results(inventory)
    assert found["numa"] == ("pass", "the node's CPUs sit on NUMA node 1")
    assert overall([r for r in evaluate(Facts(inventory, ENGINE, BENCH))]) == "pass"


def test_it_warns_when_a_gpu_has_no_backend_and_the_kernel_logged_errors(machine):
    found = results(collect(machine("nvidia-l4")), engine={"threads": 4, "quantization": "Q4_0"})
    assert found["accelerators.nvidia"][0] == "warn"
    assert (
        "NVIDIA Corporation AD104GL [L4] present (driver 535.161.08)"
        in found["accelerators.nvidia"][1]
    )
    assert "no CUDA backend" in found["accelerators.nvidia"][1]
    assert found["kernel_errors"][0] == "warn"
    assert "2 kernel errors since boot, the first: NVRM" in found["kernel_errors"][1]
    assert found["threads"][0] == "pass"
    assert "accelerators" not in found  # the family rule speaks for the GPU


def test_it_passes_a_gpu_with_its_backend_built_in(machine):
    inventory = collect(machine("nvidia-l4"))
    inventory["llama"]["backends"] = ["CUDA", "CPU"]
    assert results(inventory)["accelerators.nvidia"][0] == "pass"


def test_it_fails_a_gpu_whose_driver_is_older_than_the_matrix(machine):
    inventory = collect(machine("nvidia-l4"))
    inventory["llama"]["backends"] = ["CUDA", "CPU"]
    inventory["accelerators"]["nvidia_smi"]["gpus"][0]["driver_version"] = "470.239.06"
    status, reason = results(inventory)["accelerators.nvidia"]
    assert status == "fail"
    assert "driver 470.239.06 is older than 535.54" in reason
    # a CPU-only build serves without the GPU: the old driver is a warning there
    inventory["llama"]["backends"] = ["CPU"]
    assert results(inventory)["accelerators.nvidia"][0] == "warn"


def test_it_reads_driver_versions_by_their_leading_numbers(machine):
    inventory = collect(machine("nvidia-l4"))
    inventory["llama"]["backends"] = ["CUDA", "CPU"]
    gpu = inventory["accelerators"]["nvidia_smi"]["gpus"][0]
    gpu["driver_version"] = "550.54rc1"
    assert results(inventory)["accelerators.nvidia"][0] == "pass"
    gpu["driver_version"] = "N/A"
    status, reason = results(inventory)["accelerators.nvidia"]
    assert status == "warn" and "cannot be read" in reason


def test_it_fails_a_gpu_whose_module_is_not_loaded(machine):
    inventory = collect(machine("nvidia-l4"))
    inventory["llama"]["backends"] = ["CUDA", "CPU"]
    inventory["modules"]["loaded"] = {"ixgbe": ""}
    status, reason = results(inventory)["accelerators.nvidia"]
    assert status == "fail" and "module (nvidia) is not loaded" in reason


def test_it_fails_a_cgroup_limited_node_with_too_many_threads_and_too_little_memory(machine):
    found = results(
        collect(machine("cgroup-limited")),
        engine={"threads": 4, "quantization": "Q4_1", "kv_bytes_per_token": 196_608},
    )
    assert found["threads"] == (
        "fail",
        "threads 4 > CPU budget 2 (affinity 16 CPUs, cgroup quota 2 CPUs): set threads to 2",
    )
    assert found["memory"][0] == "fail"
    assert found["memory"][1].startswith("8 sequences × 2,048 tokens need 3.0 GiB of KV cache")
    assert found["quantization.repack"] == (
        "warn",
        "Q4_1 has no repacked kernel here; Q4_0 or Q4_K_M decodes faster at 8 sequences",
    )
    assert found["kernel_errors"][0] == "warn" and found["kernel_errors"][1].startswith(
        "not permitted"
    )
    assert found["accelerators"][0] == "warn" and "pciutils" in found["accelerators"][1]
    facts = Facts(collect(machine("cgroup-limited")), {**ENGINE, "threads": 4})
    assert overall(evaluate(facts)) == "fail"


def test_it_gives_unknowns_for_a_garbled_machine(machine):
    found = results(collect(machine("garbled")), engine={"quantization": "F16"})
    assert found["cpu.required"][0] == "warn" and found["cpu.required"][1].startswith("unknown")
    assert found["memory"][0] == "warn" and found["threads"][0] == "warn"
    assert "quantization.repack" not in found  # F16 has no rule


def test_it_warns_when_the_build_skips_an_instruction_set_the_cpu_has(machine):
    inventory = collect(machine("xeon-2numa-avx512"))
    inventory["llama"]["features"]["AVX512"] = "0"
    status, reason = results(inventory)["cpu.build"]
    assert status == "warn" and "avx512bw (AVX512)" in reason
    # the command it names is one that rebuilds (a plain `make install` has nothing to do, and
    # the Makefile never builds GGML_NATIVE on purpose)
    assert 'make -B install LLAMA_EXTRA_CMAKE_ARGS="-DGGML_AVX512=ON"' in reason
    assert "NATIVE" not in reason


def test_it_names_no_command_for_a_feature_no_build_option_adds(machine):
    inventory = collect(machine("xeon-2numa-avx512"))
    inventory["cpu"]["flags"] = [*inventory["cpu"]["flags"], "amx_int8"]
    inventory["llama"]["features"]["AMX_INT8"] = "0"
    reason = results(inventory)["cpu.build"][1]
    assert "AMX_INT8: no build option Phalanx knows to work adds it" in reason
    assert "GGML_AMX" not in reason and "NATIVE" not in reason


def test_it_advises_no_avx512_build_to_a_cpu_without_every_set_it_needs(machine):
    """Knights Landing lists avx512f but not avx512bw, which a GGML_AVX512 build uses."""
    inventory = collect(machine("xeon-2numa-avx512"))
    inventory["cpu"]["flags"] = [f for f in inventory["cpu"]["flags"] if f != "avx512bw"]
    inventory["llama"]["features"]["AVX512"] = "0"
    status, reason = results(inventory)["cpu.build"]
    assert "(AVX512)" not in reason and "GGML_AVX512=ON" not in reason, reason


def test_it_fails_a_cpu_without_avx2():
    inventory = {"cpu": {"arch": "x86_64", "flags": ["sse4_2", "avx"]}}
    status, reason = results(inventory)["cpu.required"]
    assert status == "fail" and "lacks avx2, fma, f16c" in reason


@pytest.mark.parametrize(
    ("mine", "pool", "status"),
    [(100.0, 300.0, "warn"), (200.0, 300.0, "pass"), (300.0, None, "pass")],
)
def test_it_compares_decode_speed_with_the_pool(machine, mine, pool, status):
    found = results(collect(machine("nvidia-l4")), bench={"decode_tok_s_8": mine}, pool=pool)
    assert found["pool"][0] == status


def test_it_reads_its_rules_from_the_data_file(machine):
    matrix = copy.deepcopy(load_matrix())
    matrix["numa"]["status_spanning"] = "fail"
    facts = Facts(collect(machine("xeon-2numa-avx512")), ENGINE, BENCH)
    assert {r.rule: r.status for r in evaluate(facts, matrix)}["numa"] == "fail"


def test_it_counts_the_cgroups_memory_limit_not_the_hosts(machine):
    inventory = collect(machine("xeon-2numa-avx512"))  # 238 GiB available on the host
    inventory["memory"]["cgroup_limit"] = 2 << 30
    inventory["memory"]["cgroup_usage"] = 1 << 30
    status, reason = results(inventory, engine={"held_bytes": 0})["memory"]
    assert status == "fail"
    assert "1.0 GiB left under its cgroup's limit of 2.0 GiB" in reason


def test_it_warns_when_the_nodes_cpus_are_unknown_on_a_numa_machine(machine):
    inventory = collect(machine("xeon-2numa-avx512"))
    inventory["cpu_budget"]["affinity"] = None
    assert results(inventory)["numa"][0] == "warn"
