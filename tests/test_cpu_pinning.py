"""runtime.cpu_pinning: --cpus for the split entry points and split_bench's --pin-cpus."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cpu_pinning import available_cpus, parse_cpus

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")


def test_parse_cpus_forms_and_errors():
    cpus = sorted(available_cpus())
    first = cpus[0]
    assert parse_cpus(str(first)) == {first}
    assert parse_cpus(f"{first}-{first}") == {first}
    if len(cpus) >= 2:
        assert parse_cpus(f"{cpus[0]},{cpus[1]}") == {cpus[0], cpus[1]}
    for bad in ("", "x", "1-0", "-1", "0,,1"):
        with pytest.raises(ValueError, match="--cpus must list CPU numbers"):
            parse_cpus(bad)
    missing = max(cpus) + 1000
    with pytest.raises(ValueError, match=f"CPU\\(s\\) {missing}.*available"):
        parse_cpus(str(missing))


@linux_only
def test_pin_process_pins_every_thread_including_those_started_before_and_after():
    """In a fresh process (pytest's own is left alone): import torch (which starts a thread), pin, start
    a thread and torch's pool; every thread then runs on the one CPU."""
    cpu = min(available_cpus())
    code = f"""
import json, threading, torch
from runtime.cpu_pinning import pin_process, process_cpus
pin_process({{{cpu}}})
torch.set_num_threads(1); torch.randn(64, 64) @ torch.randn(64, 64)
done = threading.Event(); t = threading.Thread(target=done.wait); t.start()
print(json.dumps(sorted(map(sorted, process_cpus())))); done.set(); t.join()
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    per_thread = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(per_thread) >= 2 and all(c == [cpu] for c in per_thread)


def test_pair_args_reject_a_bad_cpu_list_before_loading_anything():
    import argparse

    from runtime.split.pair_args import add_pair_args, load_pair_from_args

    ap = argparse.ArgumentParser()
    add_pair_args(ap)
    with pytest.raises(SystemExit, match="--cpus"):
        load_pair_from_args(ap.parse_args(["--cpus", "99999", "--pair", "/nonexistent"]))


def test_split_bench_pins_the_server_and_the_edge_apart(tmp_path, monkeypatch):
    import experiments.split_bench as sb

    monkeypatch.setattr(sb, "available_cpus", lambda: {3, 5, 7})
    args = sb.parse_args(["--out", str(tmp_path), "--pin-cpus", "on"])
    assert args.cpu_pair == (3, 5)
    assert sb._pair_flags(args)[-2:] == ["--cpus", "3"] and sb._pair_flags(args, edge=True)[-2:] == ["--cpus", "5"]
    off = sb.parse_args(["--out", str(tmp_path), "--pin-cpus", "off"])
    assert off.cpu_pair is None and "--cpus" not in sb._pair_flags(off)
    monkeypatch.setattr(sb, "available_cpus", lambda: {0})
    with pytest.raises(SystemExit, match="--pin-cpus on needs 2 CPUs"):
        sb.parse_args(["--out", str(tmp_path), "--pin-cpus", "on"])
