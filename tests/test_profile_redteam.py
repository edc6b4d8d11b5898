"""Red-team of the profilers (``runtime.profile``, ``runtime.pass_timing``): bad input refused with
the flag named *before* the pair is loaded or anything measured, a profile never gets a table of a
model other than the one it describes, and the device numbers are timed after a warm-up, in the
profile's dtype, on the device asked for. Each test failed on the code before its fix."""

import time

import pytest
import torch
import yaml

from runtime.pass_timing import model_spec


def _table(value=1e-3):
    return {"b": [1], "q": [1], "c": [8], "tau_s": [[[value]]]}


def _profile(pair, slm_model=None) -> dict:
    """A valid table profile of ``pair`` (its slm section describes ``slm_model``, default the draft)."""
    return {"name": "p", "device": {"name": "CPU", "memory_bytes": 8e9, "bandwidth_bytes_per_s": 1e10, "flops_per_s": 1e11, "reserve_bytes": 5e8},
            "llm": model_spec(pair.target, "target"), "slm": model_spec(slm_model if slm_model is not None else pair.draft, "draft"),
            "latency": {"source": "table", "llm": _table(), "slm": _table()}}


def _grid(pair):
    return ["--pair", str(pair.path), "--b", "1", "--q", "1", "--c", "8", "--repeats", "1", "--threads", "1"]


def _never(*_a, **_k):
    raise AssertionError("measured although the input was bad")


@pytest.fixture
def no_edge_measurement(monkeypatch):
    import runtime.split.role_profile as rp

    monkeypatch.setattr(rp, "edge_section", _never)


def test_edge_role_refuses_a_draft_that_is_not_the_profiles_slm(pair, tmp_path, no_edge_measurement):
    """The profile's slm is another model (here: the target): an edge table of the pair's draft
    would be priced as that model's. Refused, naming slm, before measuring; the file is unchanged."""
    from runtime.profile import main

    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(_profile(pair, slm_model=pair.target)))
    before = out.read_bytes()
    with pytest.raises(SystemExit, match="draft.*not the profile's slm"):
        main([*_grid(pair), "--role", "edge", "--out", str(out)])
    assert out.read_bytes() == before


@pytest.mark.parametrize("text", ["garbage: [1", "- 1\n", "name: x\n"])
def test_edge_role_checks_the_existing_profile_before_measuring(pair, tmp_path, no_edge_measurement, text):
    from runtime.profile import main

    out = tmp_path / "p.yaml"
    out.write_text(text)
    with pytest.raises(SystemExit, match="--out .* is not a valid profile"):
        main([*_grid(pair), "--role", "edge", "--out", str(out)])
    assert out.read_text() == text


def test_engine_only_refuses_another_pairs_profile(pair, tmp_path, monkeypatch):
    """--engine-only's residual is engine time minus *the profile's* table: against another pair's
    table it is meaningless. Refused before measuring, as --quick already does."""
    import runtime.profile as rp

    monkeypatch.setattr(rp, "measure_engine", _never)
    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(_profile(pair, slm_model=pair.target)))
    with pytest.raises(SystemExit, match="not the profile's slm"):
        rp.main([*_grid(pair), "--engine-only", "--out", str(out)])


@pytest.mark.parametrize("text", ["garbage: [1", "- 1\n"])
def test_server_role_checks_an_existing_out_before_measuring(pair, tmp_path, monkeypatch, text):
    """A server rewrite keeps --out's edge/network sections: an unreadable --out failed only after
    the whole measurement (a YAML error or AttributeError traceback)."""
    import runtime.profile as rp

    monkeypatch.setattr(rp, "measure", _never)
    out = tmp_path / "p.yaml"
    out.write_text(text)
    with pytest.raises(SystemExit, match="--out .* is not a valid profile"):
        rp.main([*_grid(pair), "--no-engine", "--out", str(out)])


def test_server_role_refuses_to_keep_an_edge_section_of_another_draft(pair, tmp_path, monkeypatch):
    """The kept edge table was measured for the old profile's slm; under a new pair's slm it would
    price the wrong model (the state the edge role refuses to write)."""
    import runtime.profile as rp

    monkeypatch.setattr(rp, "measure", _never)
    old = _profile(pair, slm_model=pair.target)
    old["edge"] = {"device": old["device"], "latency": {"source": "table", "slm": _table()}}
    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(old))
    with pytest.raises(SystemExit, match="edge section"):
        rp.main([*_grid(pair), "--no-engine", "--out", str(out)])


@pytest.mark.parametrize("flag, value", [("--device", "bogus"), ("--device", "cuda:7" if torch.cuda.is_available() else "cuda"),
                                          ("--dtype", "int8"), ("--dtype", "float"), ("--dtype", "float64x")])
def test_bad_device_or_dtype_refused_before_loading_the_pair(pair, tmp_path, monkeypatch, capsys, flag, value):
    """Loading a real pair takes minutes; --device bogus failed after it (a RuntimeError from
    .to()), --dtype int8 inside transformers, and --dtype float was accepted and recorded as
    'float' (another fingerprint than float32's: a spurious provenance warning, a cache miss)."""
    import runtime.profile as rp

    monkeypatch.setattr(rp, "load_pair", _never)
    with pytest.raises(SystemExit) as exc:
        rp.main([*_grid(pair), "--no-engine", flag, value, "--out", str(tmp_path / "p.yaml")])
    assert flag in f"{exc.value.code} {capsys.readouterr().err}"  # our message, or argparse's on stderr


def test_sync_device_waits_for_the_device_given(monkeypatch):
    """torch.cuda.synchronize() without an argument waits for the *current* device (cuda:0): a
    pass timed on cuda:1 would stop the clock before its kernels ran."""
    from runtime import pass_timing

    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(device))
    pass_timing.sync_device("cuda:1")
    pass_timing.sync_device(torch.device("cuda", 1))
    pass_timing.sync_device("cpu")
    assert len(seen) == 2 and all(d is not None and torch.device(d) == torch.device("cuda", 1) for d in seen)


def _slow_first_call(monkeypatch, cls, name, delay):
    orig = getattr(cls, name)
    calls = []

    def wrapped(self, *a, **k):
        calls.append(self.dtype)
        if len(calls) == 1:
            time.sleep(delay)  # what cuBLAS's lazy initialisation costs the first matmul on a GPU
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, name, wrapped)
    return calls


def test_device_spec_times_after_a_warm_up(monkeypatch):
    """The first matmul / copy paid one-off set-up inside the timed loop: on an H200 the shipped
    results/gpu_check/profile.yaml reads flops_per_s 1.4e11 (0.14 TFLOP/s)."""
    from runtime.pass_timing import device_spec

    torch.set_num_threads(1)
    _slow_first_call(monkeypatch, torch.Tensor, "__matmul__", 2.0)
    _slow_first_call(monkeypatch, torch.Tensor, "clone", 2.0)
    _slow_first_call(monkeypatch, torch.Tensor, "copy_", 2.0)
    spec = device_spec("cpu")
    # with the 2 s inside the timed loop: <= 5.4e9 FLOP/s (5 matmuls of 1024^3) and <= 0.17e9 B/s (5 copies of 32 MiB);
    # one CPU thread does ~1e11 and ~1e10 here, the thresholds leave room for a loaded host
    assert spec["flops_per_s"] > 12e9
    assert spec["bandwidth_bytes_per_s"] > 0.5e9


def test_device_spec_measures_the_profiles_dtype(monkeypatch):
    """envs.hardware_specs.DeviceSpec.flops_per_s is the peak 'at the models' dtype'; a float16
    profile recorded float32's."""
    from runtime.pass_timing import device_spec

    torch.set_num_threads(1)
    calls = _slow_first_call(monkeypatch, torch.Tensor, "__matmul__", 0.0)
    device_spec("cpu", "bfloat16")
    assert calls and set(calls) == {torch.bfloat16}


def test_bandwidth_is_a_copy_not_an_allocation():
    """clone() allocates 32 MiB each time; on Linux the fresh pages fault in, and the copy
    'bandwidth' came out ~3x below a copy into an existing buffer."""
    from runtime.pass_timing import device_spec

    torch.set_num_threads(1)
    src = torch.ones(32 * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, measured = 0.0, 0.0
    for _ in range(3):  # interleaved, best of three each: a loaded host slows both alike
        start = time.perf_counter()
        for _ in range(5):
            dst.copy_(src)
        best = max(best, 5 * 2 * src.numel() * 4 / (time.perf_counter() - start))
        measured = max(measured, device_spec("cpu")["bandwidth_bytes_per_s"])
    assert measured > 0.7 * best  # clone(): ~0.3-0.5 of it


def test_server_profile_records_the_device_peak_in_its_dtype(pair, tmp_path, monkeypatch):
    import runtime.profile as rp

    seen = []

    def spy(device, dtype="float32"):
        seen.append((device, dtype))
        raise AssertionError("stop here")

    monkeypatch.setattr(rp, "device_spec", spy)
    with pytest.raises(AssertionError, match="stop here"):
        rp.main([*_grid(pair), "--no-engine", "--dtype", "bfloat16", "--out", str(tmp_path / "p.yaml")])
    assert seen == [("cpu", "bfloat16")]


def test_write_profile_writes_shared_lists_out_in_full(tmp_path):
    """The quick calibration's curves share one ``q`` list; the file must not use YAML anchors."""
    from runtime.profile_inputs import write_profile

    q = [1, 5, 32]
    data = {"calibration": {"llm": {"q": q, "scale": [1.0, 1.1, 1.2]}, "slm": {"q": q, "scale": [2.0, 2.1, 2.2]}}}
    write_profile(data, tmp_path / "p.yaml")
    text = (tmp_path / "p.yaml").read_text()
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(text) == data
    assert not list(tmp_path.glob(".p.yaml.*"))  # no temporary file left behind
