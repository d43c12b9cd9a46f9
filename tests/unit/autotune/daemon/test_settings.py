from __future__ import annotations

from pathlib import Path

import pytest

from autotune.daemon.settings import load_settings
from autotune.errors import InputError


def test_precedence_defaults_toml_env_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTOTUNE_CONFIG", raising=False)
    defaults = load_settings()
    assert (defaults.host, defaults.port, defaults.tick_s) == ("127.0.0.1", 8000, 2.0)
    assert defaults.database_url.endswith("autotune.db")
    config = tmp_path / "autotune.toml"
    config.write_text('tick_s = 5\nport = 9000\ndb_url = "sqlite:///from-toml.db"\n')
    from_file = load_settings(config)
    assert (from_file.tick_s, from_file.port) == (5.0, 9000)
    monkeypatch.setenv("AUTOTUNE_PORT", "9100")
    monkeypatch.setenv("AUTOTUNE_CONFIG", str(config))
    from_env = load_settings()
    assert (from_env.tick_s, from_env.port) == (5.0, 9100)
    assert load_settings(port=9200).port == 9200
    assert load_settings(port=None).port == 9100


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTOTUNE_TICK_S": "-1"}, "setting tick_s='-1'"),
        ({"AUTOTUNE_PORT": "http"}, "setting port='http'"),
        ({"AUTOTUNE_LOG_FORMAT": "xml"}, "setting log_format='xml'"),
    ],
)
def test_bad_values_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(InputError, match=message):
        load_settings()


def test_unknown_keys_and_missing_files_are_errors(tmp_path: Path) -> None:
    config = tmp_path / "autotune.toml"
    config.write_text("tick = 5\n")
    with pytest.raises(InputError, match="tick"):
        load_settings(config)
    with pytest.raises(InputError, match="config file not found"):
        load_settings(tmp_path / "absent.toml")
    config.write_text("tick_s = [\n")
    with pytest.raises(InputError, match=r"autotune\.toml"):
        load_settings(config)
