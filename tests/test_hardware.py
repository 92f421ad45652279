from __future__ import annotations

from pathlib import Path

import pytest
from _support.hostile import hostile_path

from tuner.errors import ConfigError
from tuner.hardware import default_catalog, get_gpu


def test_catalog_has_the_campaign_gpus() -> None:
    names = default_catalog().names()
    assert {"gb300", "gb200", "b200", "h200", "h100"} <= set(names)
    gb300 = get_gpu("GB300")
    assert gb300.memory_gib == 279.0 and gb300.gpus_per_host == 4 and gb300.nvlink_domain_gpus == 72
    assert gb300.tflops("fp4") == 15000 and get_gpu("h100").tflops("fp4") == 1979  # no FP4: FP8 rate


def test_unknown_gpu_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="gb300") as err:
        get_gpu("a100x")
    assert err.value.field == "hardware"


def test_user_yaml_adds_a_gpu(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("""gpus:
  - name: mi355x
    memory_gib: 288
    hbm_bandwidth_tb_s: 8
    peak_tflops: {fp8: 5000, bf16: 2500}
    nvlink_bandwidth_gb_s: 1075
    inter_host_bandwidth_gb_s: 50
    gpus_per_host: 8
    nvlink_domain_gpus: 8
    non_torch_memory_gib: 2
""")
    assert get_gpu("mi355x", path).hbm_bandwidth_tb_s == 8
    assert get_gpu("gb300", path).memory_gib == 279.0


@pytest.mark.parametrize(("text", "needle"), [
    ("gpus: [{name: x}]", "memory_gib"),
    ("gpus:\n  - {name: x, memory_gib: -1}", "memory_gib"),
    ("not: [valid", "YAML"),
    ("- just a list", "gpus"),
])
def test_bad_yaml_names_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        get_gpu("gb300", path)


def test_unreadable_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        get_gpu("gb300", "/nonexistent.yaml")


@pytest.mark.parametrize(("kind", "says"), [
    ("fifo", "FIFO (named pipe), not a regular file"), ("directory", "a directory, not a regular file"),
    ("huge", "at most 256.0 KiB is read"), ("aliases", "YAML aliases"), ("deep", "nests deeper")])
def test_a_hostile_hardware_file_is_refused_before_it_is_read(tmp_path: Path, kind: str, says: str) -> None:
    """--hardware-file is read like every user YAML (tuner/files.py, tuner/_yaml.py): a FIFO (a plain read blocks
    for ever), a directory, a huge file, an alias bomb or absurd nesting is a ConfigError naming the file."""
    path = hostile_path(tmp_path / "gpus.yaml", kind, {
        "huge": "# pad\n" * 50_000 + "gpus: []\n", "aliases": "a: &a [1]\ngpus: [" + ", ".join(["*a"] * 200) + "]\n",
        "deep": "gpus: " + "[" * 40 + "]" * 40 + "\n"}.get(kind, ""))
    with pytest.raises(ConfigError) as bad:
        get_gpu("gb300", path)
    assert says in bad.value.message and bad.value.fix, bad.value
    assert bad.value.field in ("--hardware-file", str(path)), bad.value
