"""The host's CPU, as run.json and the benchmarks name it: read from /proc/cpuinfo (here a
hand-written one), and never empty where there is none."""

from __future__ import annotations

from pathlib import Path

from aclpipe import host

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: a second block, never read
flags\t\t: fpu sse avx2 avx512f avx512_bf16
"""


def test_cpu_name_and_machine_from_cpuinfo(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    (tmp_path / "l3").write_text("32768K\n")
    monkeypatch.setattr(host, "CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(host, "L3_CACHE", tmp_path / "l3")
    assert host.cpu_name() == "AMD EPYC 9B14 (family 25, model 17)"
    info = host.machine()
    assert info["cpu"] == "AMD EPYC 9B14 (family 25, model 17)"
    assert info["isa"] == ["avx2", "avx512f", "avx512_bf16"] and info["l3_cache"] == "32768K"


def test_without_cpuinfo_the_name_is_platforms_and_never_empty(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(host, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(host.platform, "processor", lambda: "")
    monkeypatch.setattr(host.platform, "machine", lambda: "arm64")
    assert host.cpu_name() == "arm64"
    assert "cpu" not in host.machine() and host.machine()["machine"] == "arm64"
    monkeypatch.setattr(host.platform, "machine", lambda: "")
    assert host.cpu_name() == "unknown"
