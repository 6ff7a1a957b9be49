"""`trackside [--config PATH] | demo`: bad flags and configs are a message and exit 2."""

from __future__ import annotations

import pytest

from tui.commands.dashboard import dashboard, main


def test_missing_config_file_names_the_flag(capsys, tmp_path):
    assert main(["--config", str(tmp_path / "absent.toml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_bad_config_value_names_the_key(capsys, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[hosts.gpu1]\naddress = "10.0.0.5"\nport = "abc"\n')
    assert main(["--config", str(config)]) == 2
    assert "hosts.gpu1.port" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["dance"])
    assert exit.value.code == 2


def test_config_hosts_and_poll_interval(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[defaults]\npoll_ms = 500\n[hosts.a]\n[hosts.b]\naddress = "10.0.0.5"\nnvidia_smi = "/opt/smi"\n')
    app = dashboard(str(config))
    assert list(app.watched) == ["a", "b"]
    assert app.watched["a"].host.is_local and app.watched["b"].smi == "/opt/smi"
    assert app.monitors["b"].interval == 0.5
