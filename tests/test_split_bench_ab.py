"""The paired A/B of two checkouts on the split benchmark (experiments.split_bench_ab)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.split_bench_ab import parse_args, summarise

ROOT = Path(__file__).resolve().parents[1]


def _runs(itl):
    return pd.DataFrame([{"side": side, "repeat": rep, "clients": 8, "proactive": p, "cohorts": 1, "itl_ms": itl(side, p, rep)}
                         for side in ("a", "b") for p in ("on", "off") for rep in range(2)])


def test_summary_pairs_sides_and_proactive():
    table, lines = summarise(_runs(lambda side, p, rep: {"a": 20.0, "b": 10.0}[side] * (0.5 if p == "on" else 1.0) + rep))
    on = table[table.proactive == "on"].iloc[0]
    assert (on.itl_ms_a, on.itl_ms_b) == (10.5, 5.5) and on.b_over_a == pytest.approx(5.5 / 10.5)
    assert lines == ["- a, 8 clients, 1 cohort(s): proactive on vs off ITL 10.50 vs 20.50 ms, +48.8 % lower (target >= 5 %)",
                     "- b, 8 clients, 1 cohort(s): proactive on vs off ITL 5.50 vs 10.50 ms, +47.6 % lower (target >= 5 %)"]


def test_summary_without_both_proactive_settings_has_no_check_lines():
    df = _runs(lambda side, p, rep: 1.0)
    table, lines = summarise(df[df.proactive == "on"])
    assert len(table) == 1 and lines == []


@pytest.mark.parametrize("argv, words", [(["--a", "/nonexistent"], "--a/--b must be checkouts"), (["--repeats", "0"], "--repeats >= 1"),
                                         (["--proactive", "maybe"], "--proactive takes on/off"),
                                         (["--baseline", "/nonexistent.csv"], "--baseline /nonexistent.csv is not a file")])
def test_bad_arguments_fail_fast(argv, words, tmp_path):
    base = ["--a", str(ROOT), "--b", str(ROOT), "--out", str(tmp_path / "out"), "--baseline", str(tmp_path / "b.csv")]
    (tmp_path / "b.csv").write_text("batch,gamma,tokens_per_s,tokens_per_cpu_s,itl_ms\n4,2,100,100,5\n")
    with pytest.raises(SystemExit, match=words):
        parse_args([*base, *argv])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_split_bench_ab_end_to_end(pair, tmp_path):
    base = tmp_path / "baseline.csv"
    base.write_text("batch,gamma,tokens_per_s,tokens_per_cpu_s,itl_ms\n1,2,100,100,5\n")
    res = subprocess.run([sys.executable, "-m", "experiments.split_bench_ab", "--a", str(ROOT), "--b", str(ROOT), "--out", str(tmp_path / "ab"),
                          "--clients", "1", "--cohorts", "1", "--repeats", "1", "--preset", "tiny", "--requests", "1", "--max-new-tokens", "8",
                          "--baseline", str(base)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    df = pd.read_csv(tmp_path / "ab" / "ab.csv")
    assert sorted(df.side) == ["a", "a", "b", "b"] and (df.itl_ms > 0).all()
    assert "proactive on vs off" in (tmp_path / "ab" / "ab.md").read_text()


def test_each_side_is_named_by_its_commit(tmp_path):
    from experiments.split_bench_ab import describe_checkout

    assert describe_checkout(tmp_path) == "not a git checkout"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("1")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert describe_checkout(tmp_path) == commit
    (tmp_path / "f").write_text("2")
    assert describe_checkout(tmp_path) == f"{commit} + uncommitted changes"


def test_a_relative_out_is_made_absolute(tmp_path, monkeypatch):
    """Each side's split_bench runs in its own checkout: a relative --out must not land there."""
    base = tmp_path / "baseline.csv"
    base.write_text("batch,gamma,tokens_per_s,tokens_per_cpu_s,itl_ms\n1,2,100,100,5\n")
    monkeypatch.chdir(tmp_path)
    args = parse_args(["--a", str(ROOT), "--b", str(ROOT), "--out", "rel/ab", "--baseline", str(base)])
    assert args.out == tmp_path / "rel" / "ab"


def test_each_side_gets_its_own_extra_arguments(tmp_path, monkeypatch):
    """--a-args / --b-args reach that side's split_bench only (an A/B of a switch in one checkout),
    and the report says which side ran with what."""
    import experiments.split_bench_ab as ab

    base = tmp_path / "baseline.csv"
    base.write_text("batch,gamma,tokens_per_s,tokens_per_cpu_s,itl_ms\n1,2,100,100,5\n")
    commands, real_run = [], subprocess.run

    def fake_run(cmd, **kwargs):
        if cmd[0] == "git":  # describe_checkout
            return real_run(cmd, **kwargs)
        commands.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        pd.DataFrame([{"itl_ms": 5.0 if "cheaper" in cmd else 6.0}]).to_csv(out / "split_bench.csv", index=False)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(ab.subprocess, "run", fake_run)
    ab.main(["--a", str(ROOT), "--b", str(ROOT), "--b-args", "--depth-probe cheaper", "--out", str(tmp_path / "ab"), "--clients", "2",
             "--proactive", "on", "--cohorts", "1", "--repeats", "1", "--baseline", str(base)])
    split = [c for c in commands if "experiments.split_bench" in c]
    assert len(split) == 2 and "--depth-probe" not in split[0] and split[1][-2:] == ["--depth-probe", "cheaper"]
    df = pd.read_csv(tmp_path / "ab" / "ab.csv")
    assert list(df.side) == ["a", "b"] and list(df.itl_ms) == [6.0, 5.0]
    assert "with `--depth-probe cheaper`" in (tmp_path / "ab" / "ab.md").read_text()


def test_unbalanced_quotes_in_side_arguments_fail_fast(tmp_path):
    base = tmp_path / "baseline.csv"
    base.write_text("batch,gamma,tokens_per_s,tokens_per_cpu_s,itl_ms\n1,2,100,100,5\n")
    with pytest.raises(SystemExit, match="--a-args / --b-args"):
        parse_args(["--a", str(ROOT), "--b", str(ROOT), "--out", str(tmp_path / "o"), "--baseline", str(base), "--b-args", "--x 'open"])
