"""The live server plans with the profile runtime.machine_profile resolves (auto by default)."""

from pathlib import Path

import pytest

from runtime.machine_profile import AUTO


def test_serve_config_defaults_to_auto_and_checks_the_flag():
    from runtime.serve_config import ServeConfig

    cfg = ServeConfig().validate()
    assert cfg.profile == AUTO and cfg.auto_profile is True
    with pytest.raises(ValueError, match="'auto_profile' must be true or false"):
        ServeConfig(auto_profile="yes").validate()
    with pytest.raises(ValueError, match="serve config 'profile'"):
        ServeConfig(profile="nosuch").validate()


def test_round_server_plans_with_the_resolved_profile(pair, profile, tmp_path, monkeypatch):
    import runtime.machine_profile as mp
    from runtime.rounds import RoundServer
    from runtime.serve_config import ServeConfig

    forced = RoundServer(ServeConfig(profile=str(profile), port=0), pair)
    assert forced.planning.source == "forced" and forced.planning.path == Path(profile)
    # auto on the tiny pair: the shipped base describes another pair -- refused before anything is measured or cached
    monkeypatch.setattr(mp, "default_cache_dir", lambda: tmp_path / "cache")
    with pytest.raises(ValueError, match="not the profile's llm"):
        RoundServer(ServeConfig(port=0), pair)
    assert not list((tmp_path / "cache").glob("*.yaml"))
